// Boost.JSON's sources, compiled into the fuzzers that write JSON (the Debian library is not
// built with the sanitizers).
#include <boost/json/src.hpp>
