// get<"name"> of a field the record does not have.
// build error: fixed_string<8>\{"missing"\}.*baton::get<"name">\(record\): the record has no field with this name
#include <baton/payload.hpp>

int main() {
  baton::record<baton::field<"hidden", baton::host_tensor<float>>> r;
  auto& t = baton::get<"missing">(r);
  (void)t;
}
