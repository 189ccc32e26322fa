"""Published training runs on A100 80GB: Megatron-LM, selective recompute, BLOOM, OPT, MT-NLG (pure data).

Every number is copied from the cited table; `note` says which were checked
against which copy of the source, and what the source does not give.
"""
from __future__ import annotations

from wmdist.planner.records import Citation, Layout, PublishedRun

NARAYANAN = Citation(authors="Narayanan, Shoeybi, Casper, LeGresley, Patwary, Korthikanti et al.", year=2021,
                     title="Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
                     arxiv="2104.04473", where="section 5.1, Table 1 (weak scaling); micro-batch and interleaving from "
                                               "NVIDIA's examples/sc21/run_table_1.sh (Megatron-LM, 2021-08)",
                     url="https://github.com/NVIDIA/Megatron-LM/blob/main/examples/sc21/run_table_1.sh")
NARAYANAN_T2 = Citation(authors=NARAYANAN.authors, year=2021, title=NARAYANAN.title, arxiv="2104.04473",
                        where="section 5.2, Table 2 (PTD parallelism against ZeRO-3)")
KORTHIKANTI = Citation(authors="Korthikanti, Casper, Lym, McAfee, Andersch, Shoeybi, Catanzaro", year=2022,
                       title="Reducing Activation Recomputation in Large Transformer Models", arxiv="2205.05198",
                       where="section 6.3: Table 3 (configurations), Table 5 (iteration time, MFU, HFU)")
KORTHIKANTI_DP = Citation(authors=KORTHIKANTI.authors, year=2022, title=KORTHIKANTI.title, arxiv="2205.05198",
                          where="abstract and section 6.3 (the 530B model at 8-way data parallelism)")
BLOOM = Citation(authors="BigScience Workshop (Le Scao et al.)", year=2022,
                 title="BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", arxiv="2211.05100",
                 where="section 3.4 (hardware, 3D layout); bigscience tr11-176B-ml.slurm (micro-batch, batch); "
                       "model card 'Speeds, Sizes, Times' (about 150 TFLOP/s per GPU)",
                 url="https://github.com/bigscience-workshop/bigscience/tree/master/train/tr11-176B-ml")
OPT = Citation(authors="Zhang, Roller, Goyal, Artetxe et al.", year=2022,
               title="OPT: Open Pre-trained Transformer Language Models", arxiv="2205.01068",
               where="section 2.4 (Training Efficiency); Table 1 (batch 2M tokens); the layout flags from metaseq's "
                     "launcher, metaseq/launcher/opt_baselines.py and opt_job_constants.py (released with the paper)",
               url="https://github.com/facebookresearch/metaseq/blob/main/metaseq/launcher/opt_baselines.py")
MTNLG = Citation(authors="Smith, Patwary, Norick, LeGresley, Rajbhandari et al.", year=2022,
                 title="Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", arxiv="2201.11990",
                 where="section 2.4 (system performance: batch, nodes, iteration time, TFLOP/s)")

_FULL = ("FLOPs are the paper's equation 3, which counts the recomputed forward pass, so the percentage of peak "
         "is a hardware utilization.")


def _narayanan(size: str, model: str, tp: int, pp: int, gpus: int, batch: int, tflops: int, pct: int, micro: int,
               virtual: int | None) -> PublishedRun:
    return PublishedRun(
        name=f"narayanan21-{size.lower()}", model=model, gpu="a100-80gb", cluster="selene",
        gpus=gpus, layout=Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, virtual_stages=virtual, micro_batch=micro,
                                 recompute="full"),
        seq_len=2048, global_batch=batch, tflops_per_gpu=tflops, flops_counted="hardware", hfu=pct / 100,
        citation=NARAYANAN, confidence="checked",
        note="Table 1 read in the paper's text and in the Megatron-LM README's image of it (cases_april2021.png). "
             "Section 5.1: the interleaved schedule with scatter/gather, chunk count not given. The micro-batch "
             "(MBS) and chunk count (--num-layers-per-virtual-pipeline-stage, layers per stage over it) are those "
             "of run_table_1.sh, the script NVIDIA published to reproduce Table 1; it sets no chunk count for "
             "39B and 1T, which the paper's text calls interleaved too, so those two stay open. " + _FULL)


def _ptd(model: str, tp: int, pp: int, gpus: int, batch: int, tflops: int) -> PublishedRun:
    return PublishedRun(
        name=f"narayanan21-ptd-{model.split('-')[-1]}-{gpus}gpu", model=model, gpu="a100-80gb", cluster="selene",
        gpus=gpus, layout=Layout(dp=gpus // (tp * pp), tp=tp, pp=pp, virtual_stages=None, micro_batch=1,
                                 recompute="full"),
        seq_len=2048, global_batch=batch, tflops_per_gpu=tflops, flops_counted="hardware", citation=NARAYANAN_T2,
        confidence="partly checked",
        note="Table 2 prints the model-parallel size (96 for 174.6B, 280 for 529.6B) without its split; TP 8 "
             "within a node and the rest pipeline (the paper's takeaway in section 3, and Table 1's 529.6B "
             "layout) gives PP 12 and 35. "
             + _FULL)


def _zero3(model: str, gpus: int, batch: int, micro: int, tflops: int) -> PublishedRun:
    return PublishedRun(
        name=f"narayanan21-zero3-{model.split('-')[-1]}-{gpus}gpu", model=model, gpu="a100-80gb", cluster="selene",
        gpus=gpus, layout=Layout(dp=gpus, tp=1, pp=1, zero_stage=3, micro_batch=micro, recompute="full"),
        seq_len=2048, global_batch=batch, tflops_per_gpu=tflops, flops_counted="hardware", citation=NARAYANAN_T2,
        confidence="checked", baseline="section 5.2 and Table 2: ZeRO-3 without model parallelism, run to compare "
                                       "PTD parallelism against it",
        note="ZeRO-3 through DeepSpeed with no model parallelism, batch fixed as GPUs grow. The 529.6B model did "
             "not fit 560 GPUs at micro-batch 4, so its first row uses 640 GPUs and batch 2560. Recompute is "
             "not stated for these rows; the same equation 3 (one extra forward) is assumed in the FLOPs.")


def _korthikanti(model: str, pp: int, gpus: int, batch: int, micro: int, iteration: float, mfu: float,
                 hfu: float) -> PublishedRun:
    return PublishedRun(
        name=f"korthikanti22-{model.split('-')[-1]}", model=model, gpu="a100-80gb", cluster="selene", gpus=gpus,
        layout=Layout(dp=1, tp=8, pp=pp, virtual_stages=None, micro_batch=micro, recompute="selective",
                      sequence_parallel=True),
        seq_len=2048, global_batch=batch, tflops_per_gpu=None, flops_counted="model", mfu=mfu, hfu=hfu,
        utilization_step=0.001, iteration_s=iteration, citation=KORTHIKANTI, confidence="checked",
        note="Tables 3 and 5 read in the paper's text; MFU and HFU also in the Megatron-LM README. No data "
             "parallelism in these runs. Model FLOPs are eq. 7, hardware FLOPs eq. 8 (selective recompute "
             "re-runs the attention products only). Interleaving is not stated.")


RUNS_A100: tuple[PublishedRun, ...] = (
    *(_narayanan(*row) for row in (
        ("1.7B", "megatron-1.7b", 1, 1, 32, 512, 137, 44, 16, 1),
        ("3.6B", "megatron-3.6b", 2, 1, 64, 512, 138, 44, 16, 1),
        ("7.5B", "megatron-7.5b", 4, 1, 128, 512, 142, 46, 16, 1),
        ("18.4B", "megatron-18.4b", 8, 1, 256, 1024, 135, 43, 8, 1),
        ("39.1B", "megatron-39.1b", 8, 2, 512, 1536, 138, 44, 4, None),
        ("76.1B", "megatron-76.1b", 8, 4, 1024, 1792, 140, 45, 2, 3),
        ("145.6B", "megatron-145.6b", 8, 8, 1536, 2304, 148, 47, 2, 2),
        ("310.1B", "megatron-310.1b", 8, 16, 1920, 2160, 155, 50, 1, 2),
        ("529.6B", "megatron-530b", 8, 35, 2520, 2520, 163, 52, 1, 3),
        ("1008.0B", "megatron-1t", 8, 64, 3072, 3072, 163, 52, 1, None))),
    *(_ptd(*row) for row in (
        ("gpt3-175b", 8, 12, 384, 1536, 153), ("gpt3-175b", 8, 12, 768, 1536, 149),
        ("gpt3-175b", 8, 12, 1536, 1536, 141), ("megatron-530b", 8, 35, 560, 2240, 171),
        ("megatron-530b", 8, 35, 1120, 2240, 167), ("megatron-530b", 8, 35, 2240, 2240, 159))),
    *(_zero3(*row) for row in (
        ("gpt3-175b", 384, 1536, 4, 144), ("gpt3-175b", 768, 1536, 2, 88), ("gpt3-175b", 1536, 1536, 1, 44),
        ("megatron-530b", 640, 2560, 4, 138), ("megatron-530b", 1120, 2240, 2, 98),
        ("megatron-530b", 2240, 2240, 1, 48))),
    *(_korthikanti(*row) for row in (
        ("gpt-22b", 1, 8, 4, 4, 1.10, 0.415, 0.437), ("gpt3-175b", 8, 64, 64, 1, 13.75, 0.514, 0.528),
        ("megatron-530b", 35, 280, 280, 1, 37.83, 0.560, 0.570),
        ("megatron-1t", 64, 512, 512, 1, 71.49, 0.563, 0.570))),
    PublishedRun(
        name="korthikanti22-530b-2240gpu", model="megatron-530b", gpu="a100-80gb", cluster="selene", gpus=2240,
        layout=Layout(dp=8, tp=8, pp=35, virtual_stages=None, micro_batch=1, recompute="selective",
                      sequence_parallel=True),
        seq_len=2048, global_batch=8 * 280, tflops_per_gpu=None, flops_counted="model", mfu=0.542,
        utilization_step=0.001, iteration_s=39.15, citation=KORTHIKANTI_DP, confidence="checked",
        note="Section 6.3: the Table 3 530B layout at 8-way data parallelism, batch per model instance kept "
             "(280 x 8), 39.15 s per step against 37.83 s; the data-parallel gradient all-reduce is not "
             "overlapped with backward (the paper says so), while TP's backward all-reduce overlaps the weight "
             "gradients (section 6.2)."),
    PublishedRun(
        name="korthikanti22-530b-2240gpu-full-recompute", model="megatron-530b", gpu="a100-80gb", cluster="selene",
        gpus=2240, layout=Layout(dp=8, tp=8, pp=35, virtual_stages=None, micro_batch=1, recompute="full"),
        seq_len=2048, global_batch=8 * 280, tflops_per_gpu=None, flops_counted="model", mfu=0.421,
        utilization_step=0.001, citation=KORTHIKANTI_DP, confidence="partly checked",
        baseline="abstract: full recomputation, the baseline the paper's methods are compared against",
        note="The abstract's baseline: 42.1% MFU 'using recomputation' on 2240 GPUs for the 530B model, against "
             "54.2% with the paper's methods; that it is the same layout and batch as the 54.2% run is our "
             "reading. Whether sequence parallelism was on is not said."),
    PublishedRun(
        name="bloom-176b", model="bloom-176b", gpu="a100-80gb", cluster="jean-zay", gpus=384,
        layout=Layout(dp=8, tp=4, pp=12, pipeline_padding=2, zero_stage=1, micro_batch=2, recompute="full"),
        seq_len=2048, global_batch=2048, tflops_per_gpu=150, tflops_step=10, flops_counted="hardware",
        citation=BLOOM, confidence="partly checked",
        note="Layout, micro-batch 2, global batch 2048 (after a ramp from 192), --checkpoint-activations and "
             "the 'type:transformer|embedding' stage partition (70 blocks + 2 embeddings = 12 x 6) from the "
             "training script; ZeRO stage 1 through DeepSpeed's BF16Optimizer. 'About 150 TFLOP/s' from the "
             "model card; the Megatron-DeepSpeed log it comes from counts the recomputed forward (eq. 3)."),
    PublishedRun(
        name="opt-175b", model="opt-175b", gpu="a100-80gb", cluster="meta-opt", gpus=992,
        layout=Layout(dp=124, tp=8, pp=1, zero_stage=2, micro_batch=8, recompute="full"), seq_len=2048,
        global_batch=992, batch_per_dp=8,
        printed_batch_tokens="2M", tflops_per_gpu=147, flops_counted=None, citation=OPT,
        confidence="partly checked",
        note="'Up to 147 TFLOP/s per GPU' with FSDP and Megatron-LM tensor parallelism: a peak, not an average. "
             "The layout is the metaseq launcher's, not the paper's: tensor-parallel degree 8 (model_parallel for "
             "175b, opt_job_constants.py); FSDP with --no-reshard-after-forward (the launcher names it 'zero2': "
             "weights gathered once per step and kept to backward, gradients and Adam state sharded), "
             "--checkpoint-activations (full recompute) and --update-freq 1 (no accumulation: one micro-batch "
             "of --batch-size = (2M tokens // 124 ranks) // 2048 = 8 sequences per rank), so 992 sequences, "
             "2.03M tokens, per step (opt_baselines.py). What the TFLOP/s counts (recompute or not) is not said."),
    *(PublishedRun(
        name=f"mt-nlg-530b-{gpus}gpu", model="mt-nlg-530b", gpu="a100-80gb", cluster="selene", gpus=gpus,
        layout=Layout(dp=gpus // 280, tp=8, pp=35, zero_stage=None, recompute="full"), seq_len=2048,
        global_batch=1920, tflops_per_gpu=tflops, flops_counted="hardware", iteration_s=seconds, citation=MTNLG,
        confidence="partly checked",
        note="Batch 1920 on 280, 350 and 420 DGX A100 nodes, 60.1, 50.2 and 44.4 s per iteration (section 2.4, "
             "as quoted by the llm-analysis README, not read in the PDF). TP 8 x PP 35 per 280-GPU replica is the "
             "530B (MT-NLG) layout of Korthikanti et al. Table 3. Equation 3 with full recompute reproduces the "
             "TFLOP/s from the iteration time to 0.5%. Micro-batch and ZeRO stage not checked.")
      for gpus, tflops, seconds in ((2240, 126, 60.1), (2800, 121, 50.2), (3360, 113, 44.4))),
)
