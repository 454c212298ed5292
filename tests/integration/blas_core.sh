# The CPU backend says which OpenBLAS kernels it runs (start line and the
# start event's blas_core / blas_config), the same core the linked
# libopenblas reports when asked directly (ctypes), and warns with the exact
# variable to set when forced onto a generic core on an AVX2/AVX-512 CPU.
source "$(dirname "$0")/../lib.sh"
cd "$TMP"
"$MTRAIN" data generate --out data --docs 100 >/dev/null || { fail blas_setup "data generate failed"; exit 1; }
cat >r.yaml <<'YAML'
model: {vocab_size: 257, hidden_size: 32, num_layers: 1, num_heads: 4, num_kv_heads: 2, intermediate_size: 64}
train: {seq_len: 32, micro_batch: 4, global_batch: 4, steps: 1, device: cpu}
data: {path: data}
YAML
lib=$(ldd "$MTRAIN" | sed -n 's/.*libopenblas[^ ]* => \([^ ]*\).*/\1/p' | head -1)
start() { grep '"event":"start"' "$1/metrics.jsonl"; }
field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" <<<"$1"; }

expect_exit blas_default_runs 0 env -u OPENBLAS_CORETYPE "$MTRAIN" pretrain r.yaml --set log.dir=plain
want=$(env -u OPENBLAS_CORETYPE "$PY" -c "import ctypes, sys; b = ctypes.CDLL(sys.argv[1]); b.openblas_get_corename.restype = ctypes.c_char_p; print(b.openblas_get_corename().decode())" "$lib")
ev=$(start plain)
if [ -n "$want" ] && [ "$(field "$ev" blas_core)" = "$want" ] && grep -q "^blas: OpenBLAS $want kernels" "$TMP/out" &&
   [ -n "$(field "$ev" blas_config)" ]; then
    pass blas_core_reported
else fail blas_core_reported "libopenblas says '$want'; start event: $ev"; fi
echo "  OpenBLAS core: $want" >&2

flags=$(grep -m1 '^flags' /proc/cpuinfo)
if grep -qw avx512f <<<"$flags"; then better=SkylakeX
elif grep -qw avx2 <<<"$flags"; then better=Haswell
else better=; fi
if [ -z "$better" ]; then
    skip blas_generic_core_warning "this CPU has neither AVX2 nor AVX-512: generic kernels are right for it"
else
    # this CPU's autodetected core is not a generic one
    grep -q '"blas_note"' <<<"$ev" && fail blas_default_core_not_generic "$ev" || pass blas_default_core_not_generic
    OPENBLAS_CORETYPE=Prescott "$MTRAIN" pretrain r.yaml --set log.dir=forced >"$TMP/out" 2>&1
    expect_output blas_generic_core_warning \
        "^mtrain: warning: OpenBLAS runs its generic Prescott kernels .*OPENBLAS_CORETYPE=Prescott is set: set OPENBLAS_CORETYPE=$better"
    ev=$(start forced)
    [ "$(field "$ev" blas_core)" = Prescott ] && grep -q "\"blas_note\":\".*set OPENBLAS_CORETYPE=$better\"" <<<"$ev" &&
        pass blas_generic_core_in_start_event || fail blas_generic_core_in_start_event "$ev"
fi

# OpenBLAS falling back to a generic core by itself: a shim makes
# openblas_get_corename say Prescott until mtrain has re-executed itself,
# then asks the real library, which has loaded with OPENBLAS_CORETYPE set.
if [ -n "$better" ]; then
    cat >shim.c <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
char *openblas_get_corename(void) {
    if (!getenv("MTRAIN_BLAS_REEXEC")) return "Prescott";
    char *(*real)(void) = (char *(*)(void))dlsym(RTLD_NEXT, "openblas_get_corename");
    return real ? real() : "unknown";
}
C
    gcc -shared -fPIC -o shim.so shim.c -ldl || fail blas_reexec_setup "cannot build the shim"
    export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
    env -u OPENBLAS_CORETYPE LD_PRELOAD=$PWD/shim.so "$MTRAIN" pretrain r.yaml --set log.dir=fixed >"$TMP/out" 2>&1
    ev=$(start fixed)
    [ "$(field "$ev" blas_core)" = "$better" ] &&
        grep -q "\"blas_note\":\"OpenBLAS had chosen its generic Prescott kernels: mtrain set OPENBLAS_CORETYPE=$better\"" <<<"$ev" &&
        grep -q "^blas: OpenBLAS $better kernels" "$TMP/out" && ! grep -q warning "$TMP/out" &&
        pass blas_reexec_fixes_generic_core || fail blas_reexec_fixes_generic_core "$ev $(head -c 300 "$TMP/out")"
    # under a launcher too: each rank re-executes itself before MPI starts
    OMP_NUM_THREADS=1 LD_PRELOAD=$PWD/shim.so run_np 2 pretrain r.yaml --set log.dir=fixed2 --set train.micro_batch=2 \
        >"$TMP/out" 2>&1
    [ "$(field "$(start fixed2)" blas_core)" = "$better" ] && pass blas_reexec_under_mpiexec ||
        fail blas_reexec_under_mpiexec "$(head -c 300 "$TMP/out")"
fi
exit $FAILED
