#pragma once
// Row-major Eigen views over the model's flat buffers (no copies, no allocation).
#include <Eigen/Dense>

namespace moeplan::backend::cpu {

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

}  // namespace moeplan::backend::cpu
