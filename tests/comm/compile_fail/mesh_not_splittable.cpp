// build error: device_mesh<C>: C must model baton::splittable_communicator
// A device mesh needs a communicator it can split.
#include <baton/comm/mesh.hpp>

struct fixed_group {
  int rank() const { return 0; }
  int size() const { return 1; }
};

int main() {
  fixed_group g;
  baton::device_mesh<fixed_group> mesh(g, {});
}
