/* The linear layers of the blocks (model/linear.h): the table's GEMMs, or its
 * FP8 GEMMs in an FP8 block, with the FP8 recipe of each weight. Every block
 * kind (transformer.c, moe.c, mla.c) stands on these. */
#include "config/common.h"
#include "model/linear.h"
#include "model/transformer.h"

/* the FP8 recipe of a GEMM with weight w (in the working copy): under
 * delayed scaling its site's exponents and amax record */
static struct fp8_recipe fp8_recipe_for(const struct transformer *m, const float *w) {
    if (!m->fp8_hist) {
        struct fp8_recipe r = m->fp8;
        r.input_group = m->fp8_input_group;
        return r;
    }
    const char *base = (const char *)m->weights;
    CHECK((const char *)w >= base);
    int site = fp8_history_site_at(m->fp8_hist, (size_t)((const char *)w - base) / m->be->act_bytes);
    CHECK(site >= 0); /* every weight of an FP8 block's linear layers is a site */
    return fp8_history_recipe(m->fp8_hist, m->fp8, site);
}

void linear_forward(struct transformer *m, float *out, const float *x, const float *w, int N, int K, int M,
                    int accumulate) {
    if (m->fp8_now) m->be->fp8_matmul_forward(out, x, w, N, K, M, accumulate, fp8_recipe_for(m, w));
    else m->be->matmul_forward(out, x, w, N, K, M, accumulate);
}

void linear_backward(struct transformer *m, float *dx, float *dw, const float *dout, const float *x, const float *w,
                     int N, int K, int M, int accumulate_dx) {
    if (m->fp8_now) m->be->fp8_matmul_backward(dx, dw, dout, x, w, N, K, M, accumulate_dx, fp8_recipe_for(m, w));
    else m->be->matmul_backward(dx, dw, dout, x, w, N, K, M, accumulate_dx);
}

/* Around linears that read one input one after the other (nothing else in
 * between): their FP8 GEMMs may cast the input once (kernels/ops.h,
 * fp8_recipe.input_group). Not under delayed scaling: each weight's site
 * has its own input scale there. Groups are numbered for the process: the
 * kept codes are the backend's, whichever model runs. */
void linear_same_input(struct transformer *m, int begin) {
    static unsigned groups;
    m->fp8_input_group = 0;
    if (!begin || !m->fp8_reuse || m->fp8_hist) return;
    if (++groups == 0) groups = 1; /* 0 means no group */
    m->fp8_input_group = groups;
}
