"""cuda_objects: compile .cu files with the local nvcc (/usr/local/cuda) into
a cc_library, for sm_80 and sm_90 (A100, H100/H200). rules_cuda needs the
network and a newer Bazel, so nvcc runs in a genrule per file, each with its
own TMPDIR (parallel nvcc runs can collide on temporary files). Of stoke,
a .cu file sees the SDK (-I core/sdk: //core:sdk_headers, always an input)
and the headers named in hdrs / deps_hdrs, nothing of the core's own."""

SDK = "//core:sdk_headers"

NVCC_FLAGS = " ".join([
    "-O3",
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-Xcompiler -fPIC,-fvisibility=hidden",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
])

def cuda_objects(name, srcs, hdrs = [], deps_hdrs = [], **kw):
    objs = []
    inputs = hdrs + [h for h in deps_hdrs if h != SDK] + [SDK]
    for src in srcs:
        obj = "_cuda_%s_%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + inputs,
            outs = [obj],
            cmd = ("t=$$(mktemp -d) && TMPDIR=$$t /usr/local/cuda/bin/nvcc %s " +
                   "-I core/sdk -I . -I $(GENDIR) -c $(location %s) -o $@; " +
                   "r=$$?; rm -rf $$t; exit $$r") % (NVCC_FLAGS, src),
        )
        objs.append(":" + obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = ["@cuda//:cudart"],
        linkstatic = True,
        **kw
    )
