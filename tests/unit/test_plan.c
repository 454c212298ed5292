/* mtrain plan's model (model/plan.c): its pipeline bubble is the schedule's
 * simulation (parallel/schedule.c) at the stage's backward/forward cost
 * ratio, for 1F1B and interleaved layouts; its step time adds up (the
 * schedule's busy time over the busy share, the exposed data-parallel
 * communication, AdamW); more accelerators of the same layout kind never
 * predict fewer tokens per second in total; the efficiency curves
 * interpolate in log(size) between their points and stay flat past them. */
#include <math.h>
#include <string.h>

#include "config/recipe.h"
#include "config/system.h"
#include "kernels/ops.h"
#include "model/plan.h"
#include "parallel/schedule.h"
#include "tests/unit/check.h"

static struct system_spec sys(void) {
    struct system_spec s = {.per_node = 8, .tflops_bf16 = 100, .tflops_fp8 = 200, .tflops_fp32 = 50, .mem_gib = 80,
                            .mem_gbps = 2000, .mem_eff = 0.8, .intra_gbps = 200, .intra_lat_us = 5, .inter_gbps = 25,
                            .inter_lat_us = 10};
    snprintf(s.name, sizeof s.name, "test");
    s.gemm.n = 2, s.gemm.size[0] = 1e6, s.gemm.eff[0] = 0.2, s.gemm.size[1] = 1e12, s.gemm.eff[1] = 0.8;
    s.attention.n = 1, s.attention.size[0] = 1e9, s.attention.eff[0] = 0.5;
    return s;
}

static void recipe(struct recipe *r, int pp, int vpp, int layers) {
    recipe_defaults(r);
    r->model.num_layers = layers, r->model.hidden_size = 256, r->model.num_heads = 8, r->model.num_kv_heads = 4;
    r->model.intermediate_size = 512, r->model.vocab_size = 1024;
    r->train.seq_len = 512, r->train.micro_batch = 1, r->train.global_batch = 16;
    snprintf(r->train.precision, sizeof r->train.precision, "bf16");
    r->parallel.pp = pp, r->parallel.vpp = vpp;
}

int main(void) {
    struct system_spec s = sys();
    const struct backend *be = backend_table(0, "bf16");
    static struct recipe r;
    static const int layouts[][3] = {{2, 1, 4}, {4, 1, 8}, {2, 2, 8}, {4, 2, 8}};
    for (int i = 0; i < 4; i++) {
        int pp = layouts[i][0], vpp = layouts[i][1];
        recipe(&r, pp, vpp, layouts[i][2]);
        struct plan_cost c;
        plan_predict(&r, pp * 2, &s, be, &c);
        int m = r.train.global_batch / (r.train.micro_batch * 2);
        double bubble = -1;
        int rc = schedule_simulate(vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B, pp, vpp, m, 0, c.backward_s / c.forward_s, 0,
                                   &bubble);
        char name[64];
        snprintf(name, sizeof name, "plan_bubble_pp%d_vpp%d", pp, vpp);
        TEST_RESULT(name, rc == 0 && fabs(bubble - c.bubble) < 1e-12 && c.bubble > 0, "plan %g, schedule %g (rc %d)",
                    c.bubble, bubble, rc);
        double step = m * (c.forward_s + c.backward_s) / (1 - c.bubble) + c.comm_s + c.optimizer_s;
        snprintf(name, sizeof name, "plan_step_adds_up_pp%d_vpp%d", pp, vpp);
        TEST_RESULT(name, fabs(step - c.step_s) <= 1e-9 * step, "step %g, parts %g", c.step_s, step);
    }
    /* data parallel: twice the ranks, at least as many tokens per second in total */
    recipe(&r, 1, 1, 4);
    struct plan_cost one, two;
    plan_predict(&r, 2, &s, be, &one);
    plan_predict(&r, 4, &s, be, &two);
    TEST_RESULT("plan_dp_scales", two.tokens_per_s * 4 >= one.tokens_per_s * 2 && two.step_s < one.step_s,
                "tokens/s per accelerator %g at dp 2, %g at dp 4", one.tokens_per_s, two.tokens_per_s);
    /* fp8: only the FP8 blocks' linears run at the FP8 peak (attention, the head and the blocks kept in bf16 at
     * bf16's): at an FP8 peak equal to bf16's and no gemm_fp8 curve the step is bf16's; a gemm_fp8 curve at half
     * the efficiency is the same as half the FP8 peak; a faster FP8 peak shortens the step, by less than the
     * whole of it */
    {
        const struct backend *b8 = backend_table(0, "fp8");
        struct system_spec s8 = sys();
        s8.tflops_fp8 = s8.tflops_bf16;
        recipe(&r, 1, 1, 4);
        struct plan_cost b16, f8, half_peak, half_curve, fast;
        plan_predict(&r, 2, &s, be, &b16);
        snprintf(r.train.precision, sizeof r.train.precision, "fp8");
        plan_predict(&r, 2, &s8, b8, &f8);
        TEST_RESULT("plan_fp8_at_bf16_peak_is_bf16", fabs(f8.step_s - b16.step_s) <= 1e-12 * b16.step_s,
                    "fp8 %g s, bf16 %g s", f8.step_s, b16.step_s);
        s8.tflops_fp8 = 400, plan_predict(&r, 2, &s8, b8, &fast);
        s8.tflops_fp8 = 200, plan_predict(&r, 2, &s8, b8, &half_peak);
        s8.tflops_fp8 = 400, s8.gemm_fp8 = s8.gemm;
        for (int i = 0; i < s8.gemm_fp8.n; i++) s8.gemm_fp8.eff[i] *= 0.5;
        plan_predict(&r, 2, &s8, b8, &half_curve);
        TEST_RESULT("plan_fp8_gemm_curve", fabs(half_curve.step_s - half_peak.step_s) <= 1e-12 * half_peak.step_s,
                    "half the curve %g s, half the peak %g s", half_curve.step_s, half_peak.step_s);
        TEST_RESULT("plan_fp8_peak_speeds_linears_only", fast.step_s < half_peak.step_s &&
                    fast.step_s > 0.25 * half_peak.step_s, "fp8 peak 400: %g s, 200: %g s", fast.step_s, half_peak.step_s);
        snprintf(r.train.precision, sizeof r.train.precision, "bf16");
    }
    /* the curve: log-linear between points, flat outside */
    double mid = system_curve_at(&s.gemm, 1e9), want = 0.2 + (log(1e9 / 1e6) / log(1e12 / 1e6)) * 0.6;
    TEST_RESULT("plan_curve_interpolates", fabs(mid - want) < 1e-12 && system_curve_at(&s.gemm, 1) == 0.2 &&
                system_curve_at(&s.gemm, 1e15) == 0.8, "at 1e9 %g (want %g)", mid, want);
    TEST_EXIT();
}
