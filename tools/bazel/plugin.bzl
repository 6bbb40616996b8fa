"""stoke_plugin: a plugin .so built from the SDK headers alone (//core:sdk),
exporting only stoke_plugin_v1_entry (-fvisibility=hidden)."""

def stoke_plugin(name, srcs, deps = [], linkopts = [], copts = [], **kw):
    """Builds libstoke_<name>.so; `bazel build //path:<name>` names it too."""
    native.cc_binary(
        name = "libstoke_%s.so" % name,
        srcs = srcs,
        deps = ["//core:sdk"] + deps,
        linkshared = True,
        copts = ["-fvisibility=hidden"] + copts,
        linkopts = linkopts,
        visibility = ["//visibility:public"],
        **kw
    )
    native.alias(
        name = name,
        actual = ":libstoke_%s.so" % name,
        visibility = ["//visibility:public"],
    )
