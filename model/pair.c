/* A forward and a backward of two micro batches as one unit (dualpipev's
 * pairs, parallel/schedule.h). */
#include "model/transformer.h"

double transformer_pair_chunks(struct transformer *m, int fslot, int fchunk, float *fout, float dscale, int bslot,
                               int bchunk, const float *d_out) {
    double loss = transformer_forward_chunk(m, fslot, fchunk, fout, dscale);
    transformer_backward_chunk(m, bslot, bchunk, d_out);
    return loss;
}
