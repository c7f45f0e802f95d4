// Asking for the gradient of a constant tensor.
// build error: baton::grad_t<P>: P is a constant tensor, which is never differentiated and has no gradient
#include <baton/payload.hpp>

using positions = baton::constant<baton::host_tensor<std::int64_t>>;
using g = baton::grad_t<positions>;
g* unused = nullptr;

int main() {}
