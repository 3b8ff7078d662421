#!/bin/sh
# Generates configure and the Makefile.in files from configure.ac and Makefile.am.
set -e
autoreconf -ivf
