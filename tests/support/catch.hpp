// The single place that includes Catch2 (Debian's catch2 2.13: <catch2/catch.hpp>).
#pragma once
#include <catch2/catch.hpp>
