/* cuDNN fused attention through the backend C API (see cudnn_attention.h).
 *
 * cuDNN recognises flash attention as a graph of small operations and runs
 * the whole graph as one fused kernel: the graphs below spell out causal
 * grouped-query attention op by op (two matmuls, the scale, the causal mask
 * from generated row/column indices, a softmax that also yields each row's
 * log-sum-exp), the way cuDNN's documentation describes its SDPA pattern.
 * Tensors keep mtrain's [B,T,heads,D] memory; the graph sees them as
 * [B,heads,T,D] through strides, and K's transpose is K with two strides
 * swapped. The kv head of query head h is h / (H / KVH): cuDNN broadcasts
 * K and V over the group itself.
 *
 * A graph becomes an execution plan once per shape (kept for the run); a
 * call binds the device pointers to the tensors' ids and runs the plan on
 * the default stream, with the plan's workspace from the scratch pool. */
#include <dlfcn.h>
#include <initializer_list>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cudnn_attention.h"

#if __has_include(<cudnn_graph.h>) && !defined(MTRAIN_NO_CUDNN) /* MTRAIN_NO_CUDNN: build as without it */
#include <cudnn_graph.h>
#define HAVE_CUDNN 1
#else
#define HAVE_CUDNN 0
#endif

#if HAVE_CUDNN
/* cuDNN loads sub-libraries of its own, each with a C++ runtime that takes
 * an emergency exception pool at load, and unloads some again, so a
 * sanitized build's leak check (make SANITIZE=1) would report those pools
 * from an unknown module. What cuDNN allocates while a quiet_leaks object
 * lives is not leak-checked; without the sanitizer the calls are absent. */
extern "C" void __lsan_disable(void) __attribute__((weak));
extern "C" void __lsan_enable(void) __attribute__((weak));

namespace {

struct quiet_leaks {
    quiet_leaks() {
        if (__lsan_disable) __lsan_disable();
    }
    ~quiet_leaks() {
        if (__lsan_enable) __lsan_enable();
    }
};

/* the entry points, from libcudnn.so.9 at run time */
struct {
    void *lib;
    decltype(&cudnnGetVersion) get_version;
    decltype(&cudnnGetErrorString) error_string;
    decltype(&cudnnGetLastErrorString) last_error;
    decltype(&cudnnCreate) create;
    decltype(&cudnnDestroy) destroy_handle;
    decltype(&cudnnSetStream) set_stream;
    decltype(&cudnnBackendCreateDescriptor) make;
    decltype(&cudnnBackendDestroyDescriptor) destroy;
    decltype(&cudnnBackendSetAttribute) set;
    decltype(&cudnnBackendGetAttribute) get;
    decltype(&cudnnBackendFinalize) finalize;
    decltype(&cudnnBackendExecute) execute;
} dnn;
char load_error[256];

int load(void) {
    if (dnn.lib) return 1;
    if (load_error[0]) return 0;
    quiet_leaks quiet;
    void *lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error, "libcudnn.so.9 not found (%s); add its directory to LD_LIBRARY_PATH",
                 dlerror());
        return 0;
    }
    struct { void **slot; const char *name; } syms[] = {
        {(void **)&dnn.get_version, "cudnnGetVersion"},
        {(void **)&dnn.error_string, "cudnnGetErrorString"},
        {(void **)&dnn.last_error, "cudnnGetLastErrorString"},
        {(void **)&dnn.create, "cudnnCreate"},
        {(void **)&dnn.destroy_handle, "cudnnDestroy"},
        {(void **)&dnn.set_stream, "cudnnSetStream"},
        {(void **)&dnn.make, "cudnnBackendCreateDescriptor"},
        {(void **)&dnn.destroy, "cudnnBackendDestroyDescriptor"},
        {(void **)&dnn.set, "cudnnBackendSetAttribute"},
        {(void **)&dnn.get, "cudnnBackendGetAttribute"},
        {(void **)&dnn.finalize, "cudnnBackendFinalize"},
        {(void **)&dnn.execute, "cudnnBackendExecute"},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot) {
            snprintf(load_error, sizeof load_error, "libcudnn.so.9 has no %s (cuDNN 9.0 or newer needed)",
                     syms[i].name);
            dlclose(lib);
            return 0;
        }
    }
    /* the fused attention graphs need 9.x's generated indices and select */
    size_t v = dnn.get_version();
    if (v < 90000) {
        snprintf(load_error, sizeof load_error, "cuDNN %zu.%zu is too old (9.0 or newer needed)", v / 10000,
                 v / 100 % 100);
        dlclose(lib);
        return 0;
    }
    dnn.lib = lib;
    return 1;
}

typedef cudnnBackendDescriptor_t Desc;

/* Tensor ids: the graph's inputs and outputs (bound to pointers when run);
 * intermediates are numbered from FIRST_VIRTUAL. */
enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF, UID_DO, UID_DQ, UID_DK, UID_DV,
    UID_ONE,      /* backward: 1.0 */
    UID_DOT,      /* backward: rowsum(dO * O) [B,H,T] fp32, in the workspace */
    UID_DQ_ACCUM, /* backward, not deterministic: dQ in fp32 [B,H,T,D], in the workspace */
    FIRST_VIRTUAL = 100
};

/* A graph under construction: every descriptor made (destroyed together),
 * its operations in order, and the first error with cuDNN's reason. */
struct graph {
    Desc made[192]; /* the backward with grouped queries makes 89 */
    int n_made;
    Desc ops[48];
    int n_ops;
    int64_t next_uid;
    cudnnStatus_t status;
    char why[512];
    char engine[32], loaded[32]; /* the engine of the plan; the first that reached the kernel load */
    int64_t config_workspace;    /* the workspace its engine configuration asks for */
};

void fail(graph *g, cudnnStatus_t st, const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    g->status = st;
    char reason[384] = "";
    dnn.last_error(reason, sizeof reason);
    snprintf(g->why, sizeof g->why, "%s: %s%s%s", what, dnn.error_string(st), reason[0] ? ": " : "", reason);
}

Desc make(graph *g, cudnnBackendDescriptorType_t type) {
    Desc d = NULL;
    if (g->status != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->n_made == (int)(sizeof g->made / sizeof g->made[0])) die("cudnn_attention: too many descriptors");
    cudnnStatus_t st = dnn.make(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(g, st, "cudnnBackendCreateDescriptor");
        return NULL;
    }
    g->made[g->n_made++] = d;
    return d;
}

void set(graph *g, Desc d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
         const void *value, const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t st = dnn.set(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, st, what);
}
#define SET(g, d, name, type, count, value) set(g, d, name, type, count, value, #name)

void finish(graph *g, Desc d, const char *what) {
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t st = dnn.finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) fail(g, st, what);
}

void release(graph *g) {
    for (int i = g->n_made - 1; i >= 0; i--) dnn.destroy(g->made[i]);
    g->n_made = 0;
}

/* A 4-D tensor [b, h, s, d] with its strides. uid 0: a new intermediate
 * (virtual). by_value: a host scalar passed with the call. */
struct dims4 {
    int64_t d[4], s[4];
};

Desc tensor(graph *g, int64_t uid, cudnnDataType_t type, dims4 shape, int by_value = 0) {
    Desc t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    bool is_virtual = uid == 0, value = by_value != 0;
    if (uid == 0) uid = g->next_uid++;
    int64_t align = 16;
    SET(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    SET(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, shape.d);
    SET(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, shape.s);
    SET(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    SET(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    SET(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (value) SET(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &value);
    finish(g, t, "tensor");
    return t;
}

void add_op(graph *g, Desc op, const char *what) {
    finish(g, op, what);
    if (g->status != CUDNN_STATUS_SUCCESS) return;
    if (g->n_ops == (int)(sizeof g->ops / sizeof g->ops[0])) die("cudnn_attention: too many operations");
    g->ops[g->n_ops++] = op;
}

/* an operation of type whose attributes name[i] are the descriptors d[i] (a NULL one left unset) */
struct link {
    cudnnBackendAttributeName_t name;
    Desc d;
};
void operation(graph *g, cudnnBackendDescriptorType_t type, std::initializer_list<link> links, const char *what) {
    Desc op = make(g, type);
    for (const link &l : links)
        if (l.d) set(g, op, l.name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &l.d, what);
    add_op(g, op, what);
}

/* y = mode(x[, b[, t]]) elementwise (b, t broadcast), computed in prec;
 * axis: the dimension GEN_INDEX counts along */
void pointwise(graph *g, cudnnPointwiseMode_t mode, Desc x, Desc b, Desc t, Desc y,
               cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    SET(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    SET(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) SET(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finish(g, pw, "pointwise descriptor");
    operation(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR,
              {{CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw}, {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x},
               {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b}, {CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t},
               {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y}},
              "pointwise operation");
}

/* c = a b over the last two dimensions, fp32 accumulation */
void matmul(graph *g, Desc a, Desc b, Desc c) {
    Desc mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    SET(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finish(g, mm, "matmul descriptor");
    operation(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR,
              {{CUDNN_ATTR_OPERATION_MATMUL_ADESC, a}, {CUDNN_ATTR_OPERATION_MATMUL_BDESC, b},
               {CUDNN_ATTR_OPERATION_MATMUL_CDESC, c}, {CUDNN_ATTR_OPERATION_MATMUL_DESC, mm}},
              "matmul operation");
}

/* y = reduce(x) over the dimensions where y has extent 1, in fp32 */
void reduction(graph *g, cudnnReduceTensorOp_t mode, Desc x, Desc y) {
    Desc rd = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    SET(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    SET(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finish(g, rd, "reduction descriptor");
    operation(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR,
              {{CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x}, {CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y},
               {CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd}},
              "reduction operation");
}

/* mtrain's [B,T,heads,d] memory (the query heads, or kv: the kv heads) as
 * [B,heads,T,d]; transposed: [B,heads,d,T]. A head range of wider tensors
 * keeps their strides. */
dims4 bshd(const sdpa_shape *s, int kv, int d, int transposed = 0) {
    int64_t B = s->B, T = s->T, heads = kv ? s->KVH : s->H;
    int64_t mem = kv ? (s->KVHm ? s->KVHm : s->KVH) : (s->Hm ? s->Hm : s->H);
    dims4 r = {{B, heads, T, d}, {T * mem * d, d, mem * d, 1}};
    if (transposed) {
        r.d[2] = d, r.d[3] = T;
        r.s[2] = 1, r.s[3] = mem * d;
    }
    return r;
}
/* a packed [B,H,rows,cols] intermediate */
dims4 packed(const sdpa_shape *s, int64_t rows, int64_t cols) {
    int64_t B = s->B, H = s->H;
    return dims4{{B, H, rows, cols}, {H * rows * cols, rows * cols, cols, 1}};
}
dims4 scalar(void) { return dims4{{1, 1, 1, 1}, {1, 1, 1, 1}}; }

/* x with the causal mask applied: -inf where the column (key position)
 * is past the row (query position) */
Desc causal_mask(graph *g, const sdpa_shape *s, Desc x) {
    Desc neg_inf = tensor(g, UID_NEG_INF, CUDNN_DATA_FLOAT, scalar(), 1);
    dims4 tt = packed(s, s->T, s->T);
    Desc row = tensor(g, 0, CUDNN_DATA_INT32, tt), col = tensor(g, 0, CUDNN_DATA_INT32, tt);
    Desc keep = tensor(g, 0, CUDNN_DATA_BOOLEAN, tt), masked = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, CUDNN_DATA_INT32, 2);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, CUDNN_DATA_INT32, 3);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, CUDNN_DATA_BOOLEAN);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, x, neg_inf, keep, masked);
    return masked;
}

/* out = softmax(masked scores) v; stats = each row's log-sum-exp */
void forward_graph(graph *g, const sdpa_shape *s) {
    Desc q = tensor(g, UID_Q, CUDNN_DATA_BFLOAT16, bshd(s, 0, s->D));
    Desc k_t = tensor(g, UID_K, CUDNN_DATA_BFLOAT16, bshd(s, 1, s->D, 1));
    Desc v = tensor(g, UID_V, CUDNN_DATA_BFLOAT16, bshd(s, 1, s->Dv));
    Desc o = tensor(g, UID_O, CUDNN_DATA_BFLOAT16, bshd(s, 0, s->Dv));
    Desc stats = tensor(g, UID_STATS, CUDNN_DATA_FLOAT, packed(s, s->T, 1));
    Desc scale = tensor(g, UID_SCALE, CUDNN_DATA_FLOAT, scalar(), 1);
    dims4 tt = packed(s, s->T, s->T), t1 = packed(s, s->T, 1);
    Desc raw = tensor(g, 0, CUDNN_DATA_FLOAT, tt), scaled = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    matmul(g, q, k_t, raw);
    pointwise(g, CUDNN_POINTWISE_MUL, raw, scale, NULL, scaled);
    Desc scores = causal_mask(g, s, scaled);
    Desc mx = tensor(g, 0, CUDNN_DATA_FLOAT, t1), shifted = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    Desc e = tensor(g, 0, CUDNN_DATA_FLOAT, tt), sum = tensor(g, 0, CUDNN_DATA_FLOAT, t1);
    Desc log_sum = tensor(g, 0, CUDNN_DATA_FLOAT, t1), p = tensor(g, 0, CUDNN_DATA_BFLOAT16, tt);
    reduction(g, CUDNN_REDUCE_TENSOR_MAX, scores, mx);
    pointwise(g, CUDNN_POINTWISE_SUB, scores, mx, NULL, shifted);
    pointwise(g, CUDNN_POINTWISE_EXP, shifted, NULL, NULL, e);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    pointwise(g, CUDNN_POINTWISE_LOG, sum, NULL, NULL, log_sum);
    pointwise(g, CUDNN_POINTWISE_ADD, mx, log_sum, NULL, stats);
    pointwise(g, CUDNN_POINTWISE_DIV, e, sum, NULL, p);
    matmul(g, p, v, o);
}

/* a view of x with other dims/strides (a transpose), as a new intermediate */
Desc reshape(graph *g, Desc x, cudnnDataType_t type, dims4 shape) {
    Desc y = tensor(g, 0, type, shape);
    operation(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR,
              {{CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x}, {CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y}}, "reshape operation");
    return y;
}

/* out = a b where b has KVH heads and a has H: with grouped queries the
 * product has H heads and each kv head's gradient sums its group's */
void matmul_to_kv_heads(graph *g, const sdpa_shape *s, Desc a, Desc b, Desc out, int d) {
    if (s->KVH == s->H) {
        matmul(g, a, b, out);
        return;
    }
    Desc full = tensor(g, 0, CUDNN_DATA_BFLOAT16, packed(s, s->T, d));
    matmul(g, a, b, full);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

/* dq, dk, dv of the forward above: the probabilities recomputed from the
 * saved log-sum-exp, dS = P * (dP - rowsum(dO * O)) * scale. Deterministic:
 * dQ straight from its matmul (cuDNN then orders the sum over kv tiles);
 * else into an fp32 accumulator by atomics, rounded to bf16 after. */
void backward_graph(graph *g, const sdpa_shape *s) {
    Desc q = tensor(g, UID_Q, CUDNN_DATA_BFLOAT16, bshd(s, 0, s->D));
    Desc k_t = tensor(g, UID_K, CUDNN_DATA_BFLOAT16, bshd(s, 1, s->D, 1));
    Desc v_t = tensor(g, UID_V, CUDNN_DATA_BFLOAT16, bshd(s, 1, s->Dv, 1));
    Desc o = tensor(g, UID_O, CUDNN_DATA_BFLOAT16, bshd(s, 0, s->Dv));
    Desc d_o = tensor(g, UID_DO, CUDNN_DATA_BFLOAT16, bshd(s, 0, s->Dv));
    Desc stats = tensor(g, UID_STATS, CUDNN_DATA_FLOAT, packed(s, s->T, 1));
    Desc scale = tensor(g, UID_SCALE, CUDNN_DATA_FLOAT, scalar(), 1);
    Desc one = tensor(g, UID_ONE, CUDNN_DATA_FLOAT, scalar(), 1);
    dims4 tt = packed(s, s->T, s->T), t1 = packed(s, s->T, 1), tt_t = tt;
    tt_t.s[2] = 1, tt_t.s[3] = s->T;
    /* dot = rowsum(dO * O), kept in the workspace for the fused kernel */
    Desc prod = tensor(g, 0, CUDNN_DATA_FLOAT, packed(s, s->T, s->Dv)), rowsum = tensor(g, 0, CUDNN_DATA_FLOAT, t1);
    Desc dot = tensor(g, UID_DOT, CUDNN_DATA_FLOAT, t1);
    pointwise(g, CUDNN_POINTWISE_MUL, d_o, o, NULL, prod);
    reduction(g, CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
    pointwise(g, CUDNN_POINTWISE_MUL, rowsum, one, NULL, dot);
    /* P = exp(q k^T * scale - lse), masked */
    Desc raw = tensor(g, 0, CUDNN_DATA_FLOAT, tt), scaled = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    Desc shifted = tensor(g, 0, CUDNN_DATA_FLOAT, tt), p = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    matmul(g, q, k_t, raw);
    pointwise(g, CUDNN_POINTWISE_MUL, raw, scale, NULL, scaled);
    pointwise(g, CUDNN_POINTWISE_SUB, scaled, stats, NULL, shifted);
    pointwise(g, CUDNN_POINTWISE_EXP, causal_mask(g, s, shifted), NULL, NULL, p);
    /* dV = P^T dO */
    Desc dv = tensor(g, UID_DV, CUDNN_DATA_BFLOAT16, bshd(s, 1, s->Dv));
    matmul_to_kv_heads(g, s, reshape(g, p, CUDNN_DATA_BFLOAT16, tt_t), d_o, dv, s->Dv);
    /* dS = P * (dO V^T - dot) * scale */
    Desc dp = tensor(g, 0, CUDNN_DATA_FLOAT, tt), diff = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    Desc ds_raw = tensor(g, 0, CUDNN_DATA_FLOAT, tt), ds = tensor(g, 0, CUDNN_DATA_FLOAT, tt);
    matmul(g, d_o, v_t, dp);
    pointwise(g, CUDNN_POINTWISE_SUB, dp, dot, NULL, diff);
    pointwise(g, CUDNN_POINTWISE_MUL, diff, p, NULL, ds_raw);
    pointwise(g, CUDNN_POINTWISE_MUL, ds_raw, scale, NULL, ds);
    /* dK = dS^T Q */
    Desc dk = tensor(g, UID_DK, CUDNN_DATA_BFLOAT16, bshd(s, 1, s->D));
    matmul_to_kv_heads(g, s, reshape(g, ds, CUDNN_DATA_BFLOAT16, tt_t), q, dk, s->D);
    /* dQ = dS K */
    Desc k = reshape(g, k_t, CUDNN_DATA_FLOAT, bshd(s, 1, s->D));
    Desc dq = tensor(g, UID_DQ, CUDNN_DATA_BFLOAT16, bshd(s, 0, s->D));
    if (s->deterministic) {
        matmul(g, ds, k, dq);
    } else {
        Desc acc = tensor(g, UID_DQ_ACCUM, CUDNN_DATA_FLOAT, packed(s, s->T, s->D));
        matmul(g, ds, k, acc);
        pointwise(g, CUDNN_POINTWISE_IDENTITY, acc, NULL, NULL, dq);
    }
}

/* the graph of s finalized: its operation graph descriptor, or NULL */
Desc operation_graph(graph *g, const sdpa_shape *s, int backward, cudnnHandle_t handle) {
    g->next_uid = FIRST_VIRTUAL;
    if (backward) backward_graph(g, s);
    else forward_graph(g, s);
    Desc og = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    SET(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, g->ops);
    if (handle) SET(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    finish(g, og, "operation graph");
    return g->status == CUDNN_STATUS_SUCCESS ? og : NULL;
}

/* "engine N" of an engine configuration, for messages */
void engine_name(Desc cfg, char *buf, size_t n) {
    Desc engine = NULL;
    int64_t count = 0, index = -1;
    snprintf(buf, n, "engine ?");
    if (dnn.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return;
    if (dnn.get(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &engine) ==
            CUDNN_STATUS_SUCCESS &&
        dnn.get(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index) == CUDNN_STATUS_SUCCESS)
        snprintf(buf, n, "engine %lld", (long long)index);
    dnn.destroy(engine);
}

/* The first of cuDNN's heuristic engine configurations that finalizes into
 * a plan: on the device of handle, or the one devprop describes. Returns the
 * plan (owned by g) or NULL; *reached_load: a plan failed only because the
 * driver could not load its kernel (no GPU here). */
Desc plan_for(graph *g, Desc og, cudnnHandle_t handle, Desc devprop, int *reached_load) {
    *reached_load = 0;
    Desc heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    SET(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
    SET(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (devprop) SET(g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
    finish(g, heur, "engine heuristics");
    if (g->status != CUDNN_STATUS_SUCCESS) return NULL;
    enum { MAX_CONFIGS = 8 };
    Desc cfg[MAX_CONFIGS];
    int64_t n = 0;
    for (int i = 0; i < MAX_CONFIGS; i++) cfg[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    if (g->status != CUDNN_STATUS_SUCCESS) return NULL;
    cudnnStatus_t st = dnn.get(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_CONFIGS, &n, cfg);
    if (st != CUDNN_STATUS_SUCCESS) {
        fail(g, st, "engine heuristics results");
        return NULL;
    }
    if (n > MAX_CONFIGS) n = MAX_CONFIGS; /* n counts all it has; it wrote the first MAX_CONFIGS */
    if (n == 0) {
        fail(g, CUDNN_STATUS_NOT_SUPPORTED, "no cuDNN engine for this attention graph");
        return NULL;
    }
    char first_why[512] = "";
    for (int64_t i = 0; i < n; i++) {
        Desc plan = NULL;
        st = dnn.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (st != CUDNN_STATUS_SUCCESS) {
            fail(g, st, "cudnnBackendCreateDescriptor (plan)");
            return NULL;
        }
        st = dnn.set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
        if (st == CUDNN_STATUS_SUCCESS && handle)
            st = dnn.set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        if (st == CUDNN_STATUS_SUCCESS && devprop)
            st = dnn.set(plan, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &devprop);
        if (st == CUDNN_STATUS_SUCCESS) st = dnn.finalize(plan);
        engine_name(cfg[i], g->engine, sizeof g->engine);
        int64_t one = 0;
        g->config_workspace = -1;
        dnn.get(cfg[i], CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &one, &g->config_workspace);
        if (st == CUDNN_STATUS_SUCCESS) {
            if (g->n_made == (int)(sizeof g->made / sizeof g->made[0])) die("cudnn_attention: too many descriptors");
            g->made[g->n_made++] = plan;
            return plan;
        }
        if (st == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER && !*reached_load) {
            *reached_load = 1;
            snprintf(g->loaded, sizeof g->loaded, "%s", g->engine);
        }
        if (!first_why[0]) {
            char reason[384] = "";
            dnn.last_error(reason, sizeof reason);
            snprintf(first_why, sizeof first_why, "execution plan: %s: %s", dnn.error_string(st), reason);
        }
        dnn.destroy(plan);
    }
    fail(g, st, "execution plan");
    snprintf(g->why, sizeof g->why, "%s", first_why);
    return NULL;
}

Desc device_from_json(graph *g, const char *json) {
    Desc d = make(g, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    SET(g, d, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, (int64_t)strlen(json), json);
    finish(g, d, "device properties (JSON)");
    return d;
}

/* The plans of this run, one per shape and direction (a run has a few). */
struct plan_entry {
    sdpa_shape s;
    int backward;
    graph *g; /* owns the plan's descriptors; NULL: no plan for this shape */
    Desc plan;
    int64_t workspace;
};
plan_entry plans[16];
int n_plans;
cudnnHandle_t handle;

int same_shape(const sdpa_shape *a, const sdpa_shape *b, int backward) {
    return a->B == b->B && a->T == b->T && a->H == b->H && a->KVH == b->KVH && a->D == b->D && a->Dv == b->Dv &&
           a->Hm == b->Hm && a->KVHm == b->KVHm && (!backward || a->deterministic == b->deterministic);
}

/* what the cuDNN version in use cannot run (the frontend's own limits) */
const char *unsupported(const sdpa_shape *s, int backward) {
    size_t v = dnn.get_version();
    /* the graphs are cuDNN 9.10.2 .. 9.24's: before, the mask fill was
     * -FLT_MAX and 9.10.0/9.10.1 have known attention bugs; from 9.25 the
     * deterministic backward is another algorithm, chosen differently */
    if (v < 91002) return "cuDNN before 9.10.2 (its attention graphs differ or have known bugs)";
    if (backward && s->deterministic && v >= 92500)
        return "the deterministic backward of cuDNN 9.25 or newer is not set up here";
    if (s->H % s->KVH || s->D % 8 || s->Dv % 8 || s->D > 256 || s->Dv > 256) return "head shape";
    /* before 9.16 the backward needs extra padding-mask operations when T is not a multiple of 128 */
    if (backward && v <= 91500 && s->T % 128) return "T not a multiple of 128 (cuDNN before 9.16)";
    /* the frontend refuses it although the backend builds a plan */
    if (backward && s->T == 1) return "T 1 (cuDNN's attention backward needs two positions or more)";
    return NULL;
}

/* what this GPU cannot run as set up here: on Hopper the deterministic
 * backward is the graph without a dQ accumulator alone; on later GPUs
 * cuDNN's frontend also pins an engine and its settings for it, which the
 * heuristics' first plan need not be */
const char *unsupported_here(const sdpa_shape *s, int backward) {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
        return "no CUDA device";
    if (backward && s->deterministic && major != 9)
        return "the deterministic backward is set up for Hopper (compute capability 9.x) only";
    return NULL;
}

size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The backward's workspace: rowsum(dO * O) [B,H,T] fp32, the fp32 dQ
 * accumulator [B,H,T,D] (not deterministic), then cuDNN's own; the
 * forward's is cuDNN's alone. */
size_t dot_bytes(const sdpa_shape *s) { return round256((size_t)s->B * s->H * s->T * sizeof(float)); }
size_t accumulator_bytes(const sdpa_shape *s) {
    return s->deterministic ? 0 : round256((size_t)s->B * s->H * s->T * s->D * sizeof(float));
}
size_t workspace_bytes(const sdpa_shape *s, int backward, int64_t plan_workspace) {
    return (backward ? dot_bytes(s) + accumulator_bytes(s) : 0) + round256((size_t)plan_workspace);
}

/* the plan for s, built on first use; NULL (said once per shape) if none */
plan_entry *plan_get(const sdpa_shape *s, int backward) {
    for (int i = 0; i < n_plans; i++)
        if (plans[i].backward == backward && same_shape(&plans[i].s, s, backward))
            return plans[i].g ? &plans[i] : NULL;
    static int said_full;
    if (n_plans == (int)(sizeof plans / sizeof plans[0])) {
        if (!said_full++) fprintf(stderr, "mtrain: cuDNN attention: more than 16 shapes; the rest take mtrain's kernels\n");
        return NULL;
    }
    plan_entry *e = &plans[n_plans++];
    e->s = *s, e->backward = backward, e->g = NULL;
    char why[600] = "";
    const char *no = !load() ? load_error : unsupported(s, backward);
    if (!no) no = unsupported_here(s, backward);
    if (!no && !handle) {
        quiet_leaks quiet;
        cudnnStatus_t st = dnn.create(&handle);
        /* mtrain's kernels and cuBLAS run on the legacy default stream */
        if (st == CUDNN_STATUS_SUCCESS && (st = dnn.set_stream(handle, 0)) != CUDNN_STATUS_SUCCESS)
            dnn.destroy_handle(handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            handle = NULL;
            snprintf(why, sizeof why, "cudnnCreate: %s", dnn.error_string(st));
            no = why;
        }
    }
    if (!no) {
        quiet_leaks quiet;
        graph *g = (graph *)calloc(1, sizeof(graph));
        if (!g) die("out of memory");
        Desc og = operation_graph(g, s, backward, handle);
        int reached_load = 0;
        e->plan = og ? plan_for(g, og, handle, NULL, &reached_load) : NULL;
        int64_t count = 0;
        if (e->plan && dnn.get(e->plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                               &e->workspace) != CUDNN_STATUS_SUCCESS)
            fail(g, CUDNN_STATUS_BAD_PARAM, "plan workspace size"), e->plan = NULL;
        size_t need = e->plan ? workspace_bytes(s, backward, e->workspace) : 0, free_bytes = 0, total = 0;
        if (e->plan) {
            cudaError_t mem = cudaMemGetInfo(&free_bytes, &total);
            if (mem != cudaSuccess) cudaGetLastError(); /* clears this call's error only: free_bytes stays 0 */
            if (mem == cudaSuccess && need > free_bytes / 10 * 9) {
                snprintf(g->why, sizeof g->why,
                         "its workspace (%.2f GB) does not fit in the GPU's free memory (%.2f GB)", need / 1e9,
                         free_bytes / 1e9);
                e->plan = NULL;
            }
        }
        if (e->plan) {
            e->g = g;
            return e;
        }
        snprintf(why, sizeof why, "%s", g->why);
        release(g);
        free(g);
        no = why;
    }
    static int said_load;
    if (no == load_error) {
        if (!said_load++) fprintf(stderr, "mtrain: cuDNN attention: %s; mtrain's attention kernels run\n", no);
    } else {
        fprintf(stderr, "mtrain: cuDNN attention %s (B %d T %d heads %d/%d D %d/%d): %s; mtrain's kernels run it\n",
                backward ? "backward" : "forward", s->B, s->T, s->H, s->KVH, s->D, s->Dv, no);
    }
    return NULL;
}

/* run e's plan with these tensors bound; 0, or -1 (said) if cuDNN refused */
int execute(plan_entry *e, const int64_t *uids, void *const *ptrs, int n, void *workspace) {
    graph vg = {};
    Desc pack = make(&vg, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    SET(&vg, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    SET(&vg, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    SET(&vg, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    finish(&vg, pack, "variant pack");
    if (vg.status == CUDNN_STATUS_SUCCESS) {
        cudnnStatus_t st = dnn.execute(handle, e->plan, pack);
        if (st != CUDNN_STATUS_SUCCESS) fail(&vg, st, "cudnnBackendExecute");
    }
    release(&vg);
    if (vg.status == CUDNN_STATUS_SUCCESS) return 0;
    fprintf(stderr, "mtrain: cuDNN attention %s failed (%s); mtrain's kernels run it from now on\n",
            e->backward ? "backward" : "forward", vg.why);
    release(e->g);
    free(e->g);
    e->g = NULL;
    return -1;
}

} // namespace

extern "C" void cudnn_describe(char *buf, size_t n) {
    if (!load()) {
        snprintf(buf, n, "not loadable: %s", load_error);
        return;
    }
    size_t v = dnn.get_version();
    Dl_info info;
    const char *file = dladdr((void *)dnn.make, &info) && info.dli_fname ? info.dli_fname : "?";
    snprintf(buf, n, "%zu.%zu.%zu (%s)", v / 10000, v / 100 % 100, v % 100, file);
}

extern "C" int cudnn_attention_forward(void *out, float *lse, const void *q, const void *k, const void *v,
                                       const struct sdpa_shape *s) {
    plan_entry *e = plan_get(s, 0);
    if (!e) return -1;
    alignas(16) float scale = 1.0f / sqrtf((float)s->D);
    alignas(16) float neg_inf = -INFINITY;
    int64_t uids[] = {UID_Q, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NEG_INF};
    void *ptrs[] = {(void *)q, (void *)k, (void *)v, out, lse, &scale, &neg_inf};
    void *ws = e->workspace ? cuda_scratch(SCRATCH_WORK, (size_t)e->workspace) : NULL;
    return execute(e, uids, ptrs, 7, ws);
}

/* cuDNN's deterministic backward keeps dS for the whole call, 2 B H T^T
 * bytes (4.3 GB at B 1, 32 heads, T 8192): over a budget, 1/64 of the GPU's
 * memory and at least 512 MiB, it runs on groups of kv heads (each with its
 * query heads), one call each. Returns the groups. */
int head_groups(const sdpa_shape *s) {
    if (!s->deterministic) return 1;
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) cudaGetLastError(), total = 0;
    double budget = total / 64 > (512u << 20) ? total / 64 : (512u << 20);
    int c = 1;
    while (c < s->KVH && (s->KVH % c || 2.0 * s->B * (s->H / c) * (double)s->T * s->T > budget)) c++;
    return c;
}

extern "C" int cudnn_attention_backward(void *dq, void *dk, void *dv, const void *dout, const void *out,
                                        const float *lse, const void *q, const void *k, const void *v,
                                        const struct sdpa_shape *s) {
    int groups = head_groups(s);
    sdpa_shape g = *s;
    g.H = s->H / groups, g.KVH = s->KVH / groups;
    if (groups > 1) g.Hm = s->H, g.KVHm = s->KVH;
    plan_entry *e = plan_get(&g, 1);
    if (!e) return -1;
    /* a group's lse rows are strided when B > 1, and a group's first row is off
     * cuDNN's 16-byte alignment when T is not a multiple of 4: a packed copy */
    size_t dot = dot_bytes(&g), acc = accumulator_bytes(&g), lse_row = (size_t)g.H * s->T * sizeof(float);
    size_t lse_copy = groups > 1 && (s->B > 1 || s->T % 4) ? round256(s->B * lse_row) : 0;
    char *ws = (char *)cuda_scratch(SCRATCH_WORK, workspace_bytes(&g, 1, e->workspace) + lse_copy);
    char *lse_packed = ws + workspace_bytes(&g, 1, e->workspace);
    alignas(16) float scale = 1.0f / sqrtf((float)s->D);
    alignas(16) float neg_inf = -INFINITY;
    alignas(16) float one = 1.0f;
    for (int i = 0; i < groups; i++) {
        size_t h0 = (size_t)i * g.H, k0 = (size_t)i * g.KVH; /* first query / kv head; bf16: 2 bytes */
        const float *stats = lse + h0 * s->T;
        if (lse_copy) {
            CUDA_CHECK(cudaMemcpy2DAsync(lse_packed, lse_row, stats, (size_t)s->H * s->T * sizeof(float), lse_row,
                                         s->B, cudaMemcpyDeviceToDevice, 0));
            stats = (const float *)lse_packed;
        }
        if (acc) CUDA_CHECK(cudaMemsetAsync(ws + dot, 0, acc, 0)); /* cuDNN 9.6 on zeroes it too; before, not */
        int64_t uids[] = {UID_Q,  UID_K,  UID_V,   UID_O,     UID_DO,      UID_STATS, UID_DQ,
                          UID_DK, UID_DV, UID_DOT, UID_SCALE, UID_NEG_INF, UID_ONE,   UID_DQ_ACCUM};
        void *ptrs[] = {(char *)q + 2 * h0 * s->D,     (char *)k + 2 * k0 * s->D,    (char *)v + 2 * k0 * s->Dv,
                        (char *)out + 2 * h0 * s->Dv,  (char *)dout + 2 * h0 * s->Dv, (void *)stats,
                        (char *)dq + 2 * h0 * s->D,    (char *)dk + 2 * k0 * s->D,    (char *)dv + 2 * k0 * s->Dv,
                        ws,                            &scale,                        &neg_inf,
                        &one,                          ws + dot};
        if (execute(e, uids, ptrs, acc ? 14 : 13, ws + dot + acc)) return -1;
    }
    return 0;
}

extern "C" int cudnn_attention_check(const char *device_json, const struct sdpa_shape *s, int backward, char *msg,
                                     size_t n) {
    if (!load()) {
        snprintf(msg, n, "%s", load_error);
        return -1;
    }
    const char *no = unsupported(s, backward);
    if (no) {
        snprintf(msg, n, "refused: %s", no);
        return 0;
    }
    quiet_leaks quiet;
    graph *g = (graph *)calloc(1, sizeof(graph));
    if (!g) die("out of memory");
    Desc dev = device_from_json(g, device_json);
    Desc og = dev ? operation_graph(g, s, backward, NULL) : NULL;
    int reached_load = 0;
    Desc plan = og ? plan_for(g, og, NULL, dev, &reached_load) : NULL;
    int ok = plan != NULL || reached_load;
    if (plan) snprintf(msg, n, "%s compiled a plan", g->engine);
    else if (reached_load)
        snprintf(msg, n, "%s accepted the graph (workspace %lld bytes); loading its kernel needs a GPU (%s)", g->loaded,
                 (long long)g->config_workspace, g->why);
    else snprintf(msg, n, "%s", g->why);
    release(g);
    free(g);
    return ok;
}

#else /* no cuDNN headers at build time */

extern "C" int cudnn_attention_forward(void *, float *, const void *, const void *, const void *,
                                       const struct sdpa_shape *) {
    return -1;
}
extern "C" int cudnn_attention_backward(void *, void *, void *, const void *, const void *, const float *,
                                        const void *, const void *, const void *, const struct sdpa_shape *) {
    return -1;
}

extern "C" void cudnn_describe(char *buf, size_t n) { snprintf(buf, n, "not built in (no cudnn_graph.h)"); }
extern "C" int cudnn_attention_check(const char *, const struct sdpa_shape *, int, char *msg, size_t n) {
    snprintf(msg, n, "not built in (no cudnn_graph.h)");
    return -1;
}

#endif
