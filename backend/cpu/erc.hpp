#pragma once
// The expert-router coupling (ERC) loss of Lv et al. (BACKEND.md): proxy tokens R̃_i = R_i ⊙ δ_i
// from the router rows, through every expert's gate projection W_g^j (the first half of w13).
#include <cstdint>

#include "moeplan/accounting/ledger.hpp"
#include "rng.hpp"

namespace moeplan::backend::cpu {

// delta (E,D) ~ U(1−ε_i, 1+ε_i) per element, ε_i = ‖R_i − R_nearest‖ / (2‖R_i‖); router (E,D).
// The noise is a constant of the step: no gradient flows through ε.
template <class S>
void erc_draw_noise(S* delta, const S* router, int64_t E, int64_t D, Rng& rng);

// Forward and backward in one: returns coef·loss with
// loss = (1/E²)·Σ_i Σ_{j≠i} [max(M[i,j] − α·M[i,i], 0) + max(M[j,i] − α·M[i,i], 0)],
// M[i,j] = ‖R̃_i · W_g^j‖. w13[j] points at expert j's (D, 2·De) w13; dw13[j] at its gradient.
// drouter (E,D) += coef·dloss/dR. Scratch: rt (E,D), drt (E,D), act (E, E·De), m (E,E), dm (E,E).
template <class S>
double erc_forward_backward(S* drouter, S* const* dw13, const S* router, const S* const* w13,
                            const S* delta, S* rt, S* drt, S* act, S* m, S* dm, int64_t E,
                            int64_t D, int64_t De, double alpha, double coef, FlopLedger& ledger);

}  // namespace moeplan::backend::cpu
