"""stoke_fuzz_test: a fuzz target (NAME_fuzz.c) run by driver.c as a cmocka
test over its seed corpus (corpus/NAME), the inputs that once failed
(regress/NAME) and deterministic mutations of them. tools/fuzz.sh runs the
same target under libFuzzer."""

def stoke_fuzz_test(name, deps = [], linkopts = [], srcs = [], size = "small"):
    """srcs: sources linked in besides NAME_fuzz.c (a plugin's own file)."""
    native.cc_test(
        name = name + "_fuzz_test",
        size = size,
        srcs = [name + "_fuzz.c", "driver.c"] + srcs,
        deps = deps,
        data = native.glob(["corpus/" + name + "/**", "regress/" + name + "/**"]),
        args = ["tests/fuzz/corpus/" + name, "tests/fuzz/regress/" + name],
        linkopts = linkopts + ["-lcmocka"],
    )
