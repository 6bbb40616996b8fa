#!/bin/sh
# Stand-in coverage tool: this offline build has no coverage tooling.
echo "stoke: coverage tools are not available in the offline Bazel build" >&2
exit 1
