#pragma once
// Row-major Eigen views over the model's flat buffers (no copies, no allocation).
#include <Eigen/Dense>
#include <vector>

namespace moeplan::backend::cpu {

// Every model buffer starts at Eigen's widest alignment. Eigen peels unaligned heads off
// vectorised loops and reductions, so a buffer's address would otherwise change the order of
// sums and which elements take the scalar exp: with equal alignment two models, or a model and
// its resumed copy, compute bit for bit alike.
template <class S>
using Buffer = std::vector<S, Eigen::aligned_allocator<S>>;

template <class S>
using Mat = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class S>
using MMap = Eigen::Map<Mat<S>>;
template <class S>
using CMap = Eigen::Map<const Mat<S>>;
// A column block of a wider row-major buffer (one head of qkv, one half of w13).
template <class S>
using SMap = Eigen::Map<Mat<S>, 0, Eigen::OuterStride<>>;
template <class S>
using CSMap = Eigen::Map<const Mat<S>, 0, Eigen::OuterStride<>>;

// A contiguous run of scalars as an array, for vectorised element-wise math.
template <class S>
using AMap = Eigen::Map<Eigen::Array<S, Eigen::Dynamic, 1>>;
template <class S>
using CAMap = Eigen::Map<const Eigen::Array<S, Eigen::Dynamic, 1>>;

}  // namespace moeplan::backend::cpu
