"""Shared by the PyTorch peers of the MoE GPU benchmarks (scripts/bench/moe_gpu.sh):
a recipe's model section read the way mtrain reads it, the Hugging Face config of
that model, and the kernel launches and host synchronisations of a callable
counted with torch.profiler."""
import yaml

import torch


def recipe_model(path):
    """(model section, train section) of an mtrain recipe; PyYAML (YAML 1.1) reads 1e-6 as a string"""
    doc = yaml.safe_load(open(path))
    m, t = doc["model"], doc.get("train", {})
    for k, v in m.items():
        if isinstance(v, str):
            try:
                m[k] = float(v)
            except ValueError:
                pass
    return m, t


def hf_config(m, seq_len):
    """The transformers 5.x config of the recipe's model (mixtral or deepseek_v3): the same shapes as mtrain's"""
    if m["arch"] == "mixtral":
        from transformers import MixtralConfig
        return MixtralConfig(
            vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["moe_intermediate_size"],
            num_hidden_layers=m["num_layers"], num_attention_heads=m["num_heads"],
            num_key_value_heads=m["num_kv_heads"], num_local_experts=m["num_experts"],
            num_experts_per_tok=m["experts_per_token"], max_position_embeddings=max(seq_len, m["max_seq_len"]),
            rms_norm_eps=m["norm_eps"], tie_word_embeddings=bool(m.get("tie_embeddings", False)),
            initializer_range=m.get("init_std", 0.02),
            rope_parameters={"rope_type": "default", "rope_theta": m["rope_theta"]},
            # the balance loss is part of the step, as in mtrain (model.moe_aux_loss_coef)
            output_router_logits=m.get("moe_aux_loss_coef", 0) > 0, router_aux_loss_coef=m.get("moe_aux_loss_coef", 0))
    if m["arch"] == "deepseek_v3":
        from transformers import DeepseekV3Config
        return DeepseekV3Config(
            vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["intermediate_size"],
            moe_intermediate_size=m["moe_intermediate_size"], num_hidden_layers=m["num_layers"],
            num_attention_heads=m["num_heads"], num_key_value_heads=m["num_heads"],
            n_shared_experts=m["moe_shared_experts"], n_routed_experts=m["num_experts"],
            routed_scaling_factor=m["moe_routed_scaling"], kv_lora_rank=m["kv_lora_rank"],
            q_lora_rank=m["q_lora_rank"] or None, qk_rope_head_dim=m["qk_rope_head_dim"], v_head_dim=m["v_head_dim"],
            qk_nope_head_dim=m["qk_nope_head_dim"], n_group=m["moe_n_group"], topk_group=m["moe_topk_group"],
            num_experts_per_tok=m["experts_per_token"], first_k_dense_replace=m["first_k_dense"], norm_topk_prob=True,
            max_position_embeddings=max(seq_len, m["max_seq_len"]), rms_norm_eps=m["norm_eps"],
            tie_word_embeddings=bool(m.get("tie_embeddings", False)), num_mtp_layers=0,
            initializer_range=m.get("init_std", 0.02),
            rope_parameters={"rope_type": "yarn", "rope_theta": m["rope_theta"], "factor": m["rope_scaling_factor"],
                             "original_max_position_embeddings": m["rope_original_max_pos"],
                             "beta_fast": m["yarn_beta_fast"], "beta_slow": m["yarn_beta_slow"],
                             "mscale": m["yarn_mscale"], "mscale_all_dim": m["yarn_mscale_all_dim"]})
    raise SystemExit("torch_moe: model.arch %r is not an MoE family (mixtral, deepseek_v3)" % m["arch"])


# CUDA runtime and driver calls that start a kernel, and those that make the host wait for the device
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel")
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def count_launches_and_syncs(fn, device):
    """(kernel launches, host synchronisations) of one call of fn, from torch.profiler's CUDA runtime events;
    (None, None) away from a GPU"""
    if device != "cuda":
        fn()
        return None, None
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    launches = syncs = 0
    for e in prof.events():
        if e.name in LAUNCHES:
            launches += 1
        elif e.name in SYNCS:
            syncs += 1
    return launches, syncs - 1  # less the synchronize that ends the profiled region
