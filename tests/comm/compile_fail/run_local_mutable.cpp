// build error: run_local.n, fn.: fn must be callable
// run_local calls fn from n threads at once, so a mutable lambda (unsynchronised state) is
// rejected with a message saying how to share state instead.
#include <baton/comm/local.hpp>

int main() {
  int calls = 0;
  baton::run_local(2, [calls](baton::local_communicator&) mutable { ++calls; });
}
