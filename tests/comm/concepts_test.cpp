// The capability concepts accept the backends and reject types that miss one requirement.
#include "catch.hpp"

#include <baton/comm.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace {

struct good_request {
  void wait() {}
  bool test() { return true; }
};

// Each broken type misses exactly one thing a concept asks for.
struct no_size {
  int rank() const { return 0; }
};
struct long_rank {  // rank() must return int, not a wider type
  long rank() const { return 0; }
  int size() const { return 1; }
};
struct request_without_test {
  void wait() {}
};
struct copy_only_request {  // a request must be movable
  copy_only_request() = default;
  copy_only_request(copy_only_request&&) = delete;
  void wait() {}
  bool test() { return true; }
};
struct base {
  int rank() const { return 0; }
  int size() const { return 1; }
};
struct p2p_without_test : base {
  request_without_test isend(std::span<const std::byte>, int, int) { return {}; }
  request_without_test irecv(std::span<std::byte>, int, int) { return {}; }
};
struct p2p_unmovable_request : base {
  copy_only_request isend(std::span<const std::byte>, int, int);
  copy_only_request irecv(std::span<std::byte>, int, int);
};
struct send_only : base {
  good_request isend(std::span<const std::byte>, int, int) { return {}; }
};
struct good_p2p : base {
  good_request isend(std::span<const std::byte>, int, int) { return {}; }
  good_request irecv(std::span<std::byte>, int, int) { return {}; }
};
struct float_only_reduce : base {  // all_reduce must take the four element types
  void all_reduce(std::span<float>, baton::reduce_op) {}
};
struct good_reduce : base {
  template <class T>
  void all_reduce(std::span<T>, baton::reduce_op) {}
};
struct split_to_other_type : base {  // split must return the same communicator type
  base split(int, int) { return {}; }
};
struct good_split : base {
  good_split split(int, int) { return {}; }
};
struct shift_returning_void : base {
  void shift(std::span<const std::byte>, std::span<std::byte>, int, int) {}
};
struct good_shift : base {
  good_request shift(std::span<const std::byte>, std::span<std::byte>, int, int) { return {}; }
};
struct gather_without_bytes : base {  // all_gather must accept any trivially copyable type
  void all_gather(std::span<const float>, std::span<float>) {}
};
struct broadcast_without_root : base {
  template <class T>
  void broadcast(std::span<T>) {}
};
struct all_to_all_without_v : base {
  template <class T>
  void all_to_all(std::span<const T>, std::span<T>) {}
};

}  // namespace

TEST_CASE("concepts: the local world models every capability", "[comm][concepts]") {
  using C = baton::local_communicator;
  STATIC_REQUIRE(baton::communicator<C>);
  STATIC_REQUIRE(baton::point_to_point_communicator<C>);
  STATIC_REQUIRE(baton::all_reduce_communicator<C>);
  STATIC_REQUIRE(baton::all_gather_communicator<C>);
  STATIC_REQUIRE(baton::all_to_all_communicator<C>);
  STATIC_REQUIRE(baton::broadcast_communicator<C>);
  STATIC_REQUIRE(baton::barrier_communicator<C>);
  STATIC_REQUIRE(baton::splittable_communicator<C>);
  STATIC_REQUIRE(baton::ring_communicator<C>);
  STATIC_REQUIRE(baton::collective_communicator<C>);
  STATIC_REQUIRE(baton::comm_request<baton::local_request>);
  STATIC_REQUIRE(std::is_same_v<baton::comm_request_t<C>, baton::local_request>);
  STATIC_REQUIRE(!std::is_copy_constructible_v<baton::local_request>);
}

TEST_CASE("concepts: types missing one requirement are rejected", "[comm][concepts]") {
  STATIC_REQUIRE(!baton::communicator<no_size>);
  STATIC_REQUIRE(!baton::communicator<long_rank>);
  STATIC_REQUIRE(baton::communicator<base>);

  STATIC_REQUIRE(baton::comm_request<good_request>);
  STATIC_REQUIRE(!baton::comm_request<request_without_test>);
  STATIC_REQUIRE(!baton::comm_request<copy_only_request>);

  STATIC_REQUIRE(baton::point_to_point_communicator<good_p2p>);
  STATIC_REQUIRE(!baton::point_to_point_communicator<send_only>);
  STATIC_REQUIRE(!baton::point_to_point_communicator<p2p_without_test>);
  STATIC_REQUIRE(!baton::point_to_point_communicator<p2p_unmovable_request>);
  STATIC_REQUIRE(!baton::point_to_point_communicator<base>);

  STATIC_REQUIRE(baton::all_reduce_communicator<good_reduce>);
  STATIC_REQUIRE(!baton::all_reduce_communicator<float_only_reduce>);

  STATIC_REQUIRE(baton::splittable_communicator<good_split>);
  STATIC_REQUIRE(!baton::splittable_communicator<split_to_other_type>);

  STATIC_REQUIRE(baton::ring_communicator<good_shift>);
  STATIC_REQUIRE(!baton::ring_communicator<shift_returning_void>);

  STATIC_REQUIRE(!baton::all_gather_communicator<gather_without_bytes>);
  STATIC_REQUIRE(!baton::broadcast_communicator<broadcast_without_root>);
  STATIC_REQUIRE(!baton::all_to_all_communicator<all_to_all_without_v>);
  STATIC_REQUIRE(!baton::barrier_communicator<base>);
  STATIC_REQUIRE(!baton::collective_communicator<good_reduce>);
}

TEST_CASE("concepts: reducible and communicable element types", "[comm][concepts]") {
  STATIC_REQUIRE(baton::reducible_element<float>);
  STATIC_REQUIRE(baton::reducible_element<std::int64_t>);
  STATIC_REQUIRE(!baton::reducible_element<std::int16_t>);
  STATIC_REQUIRE(!baton::reducible_element<const float>);
  STATIC_REQUIRE(baton::communicable_element<std::byte>);
  struct pod {
    int a;
    float b;
  };
  STATIC_REQUIRE(baton::communicable_element<pod>);
  STATIC_REQUIRE(!baton::communicable_element<std::vector<int>>);
}

TEST_CASE("mesh: rank <-> coordinates", "[comm][mesh]") {
  constexpr baton::mesh_shape shape{.pp = 2, .dp = 3, .cp_ring = 2, .cp_ulysses = 2};
  STATIC_REQUIRE(shape.size() == 24);
  // cp_ulysses varies fastest, pp slowest.
  STATIC_REQUIRE(baton::mesh_coords_of(shape, 1) == baton::mesh_coords{.cp_ulysses = 1});
  STATIC_REQUIRE(baton::mesh_coords_of(shape, 2) == baton::mesh_coords{.cp_ring = 1});
  STATIC_REQUIRE(baton::mesh_coords_of(shape, 12) == baton::mesh_coords{.pp = 1});
  for (int r = 0; r < shape.size(); ++r) REQUIRE(baton::mesh_rank_of(shape, baton::mesh_coords_of(shape, r)) == r);
  REQUIRE_THROWS_WITH(baton::mesh_coords_of(shape, 24), Catch::Contains("rank 24 is outside the mesh"));
  REQUIRE_THROWS_WITH(baton::mesh_rank_of(shape, {.dp = 3}), Catch::Contains("dp=3 is outside"));
  REQUIRE(shape.text() == "pp=2 x dp=3 x cp_ring=2 x cp_ulysses=2");
}
