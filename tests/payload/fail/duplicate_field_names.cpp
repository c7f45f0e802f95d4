// Two fields with one name.
// build error: baton::record: two fields have the same name. field names must be unique
#include <baton/payload.hpp>

using bad = baton::record<baton::field<"hidden", baton::host_tensor<float>>, baton::field<"hidden", baton::host_tensor<double>>>;
bad value;

int main() {}
