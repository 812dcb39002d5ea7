// Catch2's main, in a file of its own so that it compiles once (the dplb_catch_main object library, which
// every test executable links: dplb's, the mock engine's and the bench client's).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
