/* dualpipev's pairs (parallel/schedule.h): a forward and a backward of two
 * micro batches (other chunks) as one unit. Their passes' steps alternate
 * (model/transformer.h struct chunk_pass), so that when an MoE layer of one
 * begins its token all-to-all (dispatch or combine, forward or backward) the
 * other's next step computes while the rows move: the forward's attention
 * and shared experts, or its experts, overlap the backward's all-to-alls and
 * the other way round. The backward runs on a second set of exchange
 * scratch (model/moe.h moe_lane_swap). Each pass does exactly what it does
 * alone, in the same order, so the numbers are the same as running them in
 * turn; over NCCL or with device memory over MPI the all-to-all completes
 * as it begins (comm_all_to_all_v_start), and full recomputation (whose
 * re-run layers share one set of activations) runs the passes in turn. */
#include "model/moe.h"
#include "model/transformer.h"

int transformer_pairs_overlap(const struct transformer *m) {
    return m->n_moe_layers > 0 && moe_phases(m) > 1 && m->recompute != RECOMPUTE_FULL;
}

double transformer_pair_chunks(struct transformer *m, int fslot, int fchunk, float *fout, float dscale, int bslot,
                               int bchunk, const float *d_out) {
    struct chunk_pass f, b;
    transformer_pass_begin(&f, 0, fslot, fchunk, fout, NULL, dscale);
    transformer_pass_begin(&b, 1, bslot, bchunk, NULL, d_out, 0.0f);
    if (!transformer_pairs_overlap(m)) {
        while (transformer_pass_step(m, &f)) {
        }
        while (transformer_pass_step(m, &b)) {
        }
        return f.loss;
    }
    for (int fmore = 1, bmore = 1; fmore || bmore;) {
        if (fmore) fmore = transformer_pass_step(m, &f);
        if (!bmore) continue;
        moe_lane_swap(m);
        bmore = transformer_pass_step(m, &b);
        moe_lane_swap(m);
    }
    return f.loss;
}
