// A registry whose ranges overlap does not compile, and the error names the overlap.
// build error: baton tag registry: two tag ranges overlap
#include <baton/core/tags.hpp>

using mine = baton::tag_range<"my protocol", 2000, 8>;
using theirs = baton::tag_range<"their stream", 2004, 4>;
static_assert(baton::tag_registry<mine, theirs>::disjoint);

int main() {}
