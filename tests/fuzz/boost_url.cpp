// Boost.URL's sources, compiled into the query-string fuzzer with the sanitizers and libFuzzer's
// coverage, so that its parsing is fuzzed too.
#include <boost/url/src.hpp>
