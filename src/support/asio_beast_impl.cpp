// The one translation unit that compiles Asio and Beast (separate compilation): every other target
// sees only their declarations, which keeps a one-file change to a few seconds of rebuild.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
