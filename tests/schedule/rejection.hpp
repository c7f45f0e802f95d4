// The error validate() gives a program the test expects it to reject (shared by the
// validation tests; a program it accepts fails the calling test case).
#pragma once

#include "catch.hpp"

#include <baton/schedule.hpp>

namespace schedule_test {

inline baton::schedule_error rejection(const baton::program& prog) {
  try {
    baton::validate(prog);
  } catch (const baton::schedule_error& e) {
    return e;
  }
  FAIL("validate() accepted:\n" << baton::to_csv(prog));
  return baton::schedule_error("unreachable");
}

}  // namespace schedule_test
