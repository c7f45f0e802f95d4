// A type without payload_traits is used as a payload: the error names the type and says how
// to specialise the trait.
// build error: payload_traits_not_specialised_for<my_unadapted_tensor>.*payload_traits<T> is not specialised for this type: specialise it \(see docs/payloads.md\)
#include <baton/payload.hpp>

struct my_unadapted_tensor {
  float values[4];
};

int main() {
  my_unadapted_tensor t{};
  auto parts = baton::split_microbatches(t, 2);
  (void)parts;
}
