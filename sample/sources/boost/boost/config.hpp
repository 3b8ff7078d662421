//  Boost config.hpp (sample): the visibility macros the compiled libraries use.

#ifndef BOOST_CONFIG_HPP
#define BOOST_CONFIG_HPP

#include <boost/version.hpp>

#define BOOST_SYMBOL_EXPORT __attribute__((__visibility__("default")))
#define BOOST_SYMBOL_IMPORT
#define BOOST_SYMBOL_VISIBLE __attribute__((__visibility__("default")))

#if defined(BOOST_SYSTEM_SOURCE)
#  define BOOST_SYSTEM_DECL BOOST_SYMBOL_EXPORT
#else
#  define BOOST_SYSTEM_DECL BOOST_SYMBOL_IMPORT
#endif

#if defined(BOOST_THREAD_SOURCE)
#  define BOOST_THREAD_DECL BOOST_SYMBOL_EXPORT
#else
#  define BOOST_THREAD_DECL BOOST_SYMBOL_IMPORT
#endif

#endif // BOOST_CONFIG_HPP
