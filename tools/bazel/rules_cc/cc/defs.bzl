# Offline stand-in for @rules_cc//cc:defs.bzl: each rule forwards to the
# native one (Debian's bazel-rules-cc is too new for Bazel 4.2.3).
def cc_binary(**kw):
    native.cc_binary(**kw)

def cc_import(**kw):
    native.cc_import(**kw)

def cc_library(**kw):
    native.cc_library(**kw)

def cc_test(**kw):
    native.cc_test(**kw)

def cc_toolchain(**kw):
    native.cc_toolchain(**kw)

def cc_toolchain_suite(**kw):
    native.cc_toolchain_suite(**kw)
