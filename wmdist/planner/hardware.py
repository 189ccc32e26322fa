"""GPU types and the clusters published runs used, as data with their sources (pure).

Units are SI throughout: FLOP/s, bytes, bytes per second. Link bandwidths are
stored the way the source prints them and named for it: NVIDIA's datasheets
give NVLink as the sum of both directions ("600 GB/s" on an A100 is 300 GB/s
each way), network cards are sold in bits per second per port and direction.
A planner wants what one GPU can send while it receives as much, so each
record also answers that (`nvlink_send_bytes_per_s`, `network_send_bytes_per_s`).

Peak FLOP/s is the dense bf16 tensor-core figure (the datasheets' headline
doubles it "with sparsity"; no published run here used 2:4 sparsity). HBM is
the capacity the datasheet names, "80GB", read as 80 * 10**9 bytes: the
smaller of its two readings (80 GiB is 7% more, and the driver keeps some), so
a layout that fits by this figure fits on the card. Link latencies are not
here: no datasheet or paper prints them for these fabrics.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 10 ** 9
TERA = 10 ** 12
GBIT = 10 ** 9               # bits per second in one Gb/s


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One GPU model as its datasheet gives it, plus the network a node of them is usually built with."""
    name: str                       # the key in GPUS
    generation: str                 # Ampere, Hopper
    peak_bf16_flops: float          # dense bf16/fp16 tensor-core FLOP/s
    hbm_bytes: int
    hbm_bytes_per_s: float
    nvlink: str                     # which NVLink, in words
    nvlink_bytes_per_s: float       # per GPU, both directions summed, as the datasheet prints it
    gpus_per_node: int              # the HGX/DGX board: NVLink joins this many through NVSwitch
    network_bits_per_s: float       # typical inter-node bandwidth per GPU, one direction (one NIC per GPU)
    sms: int                        # streaming multiprocessors
    source: str

    @property
    def nvlink_send_bytes_per_s(self) -> float:
        """What one GPU sends over NVLink while receiving as much: half the datasheet's two-way sum."""
        return self.nvlink_bytes_per_s / 2

    @property
    def network_send_bytes_per_s(self) -> float:
        """The typical inter-node bandwidth per GPU in bytes per second, one direction."""
        return self.network_bits_per_s / 8


@dataclass(frozen=True, kw_only=True)
class ClusterFabric:
    """The machine a published run used, as its paper describes it: GPU type, node shape, network per GPU."""
    name: str                       # the key in CLUSTERS
    gpu: str                        # a key of GPUS
    gpus_per_node: int
    network_bits_per_s: float       # inter-node bandwidth per GPU, one direction, as the paper gives it
    fabric: str                     # the paper's description, in words
    network_published: bool = True  # False: the paper does not describe its network; the GPU's typical stands in
    source: str

    @property
    def network_send_bytes_per_s(self) -> float:
        """Inter-node bandwidth per GPU in bytes per second, one direction."""
        return self.network_bits_per_s / 8


GPUS: dict[str, GpuType] = {g.name: g for g in (
    GpuType(name="a100-80gb", generation="Ampere", peak_bf16_flops=312 * TERA, hbm_bytes=80 * GB,
            hbm_bytes_per_s=2039 * GB, nvlink="NVLink 3, 12 links", nvlink_bytes_per_s=600 * GB,
            gpus_per_node=8, network_bits_per_s=200 * GBIT, sms=108,
            source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: BF16 312 TFLOPS dense, "
                   "HBM2e 2,039 GB/s, NVLink 600 GB/s; 108 SMs: NVIDIA A100 whitepaper); network: one 200 Gb/s HDR InfiniBand port per GPU "
                   "as in the DGX A100 user guide"),
    GpuType(name="h100", generation="Hopper", peak_bf16_flops=989.4 * TERA, hbm_bytes=80 * GB,
            hbm_bytes_per_s=3350 * GB, nvlink="NVLink 4, 18 links", nvlink_bytes_per_s=900 * GB,
            gpus_per_node=8, network_bits_per_s=400 * GBIT, sms=132,
            source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: BF16 1,979 TFLOPS with sparsity, "
                   "so 989.4 dense; HBM3 3.35 TB/s; NVLink 900 GB/s; 132 SMs on the SXM5 part); network: one 400 Gb/s "
                   "ConnectX-7 (NDR InfiniBand or RoCE) per GPU as in the DGX H100 user guide"),
)}

CLUSTERS: dict[str, ClusterFabric] = {c.name: c for c in (
    ClusterFabric(name="selene", gpu="a100-80gb", gpus_per_node=8, network_bits_per_s=200 * GBIT,
                  fabric="NVIDIA Selene, DGX A100 nodes: NVLink/NVSwitch inside, eight 200 Gb/s HDR "
                         "InfiniBand HCAs per node for the application (two more for storage), a three-level "
                         "fat tree of 850 switches",
                  source="Narayanan et al. 2021 (arXiv 2104.04473), section 5"),
    ClusterFabric(name="jean-zay", gpu="a100-80gb", gpus_per_node=8, network_bits_per_s=50 * GBIT,
                  fabric="Jean Zay (IDRIS), 48 nodes of 8 A100 80GB: NVLink inside, four 100 Gb/s "
                         "Omni-Path links per node (50 Gb/s per GPU)",
                  source="BigScience 2022, BLOOM (arXiv 2211.05100), section 3.4 (hardware)"),
    ClusterFabric(name="meta-opt", gpu="a100-80gb", gpus_per_node=8, network_bits_per_s=200 * GBIT,
                  network_published=False,
                  fabric="992 A100 80GB (124 nodes of 8); the paper does not describe the network, "
                         "so the DGX A100 typical 200 Gb/s per GPU stands in. metaseq's launcher keeps the OPT "
                         "data on Azure (opt_job_constants.DATA_LOCATIONS), whose NDm A100 v4 VMs of 8 A100 80GB "
                         "have eight 200 Gb/s HDR InfiniBand links: the same 200 Gb/s per GPU",
                  source="Zhang et al. 2022, OPT (arXiv 2205.01068), section 2.4 (GPU count only); metaseq "
                         "launcher; Azure NDm A100 v4 series documentation"),
    ClusterFabric(name="meta-llama3-roce", gpu="h100", gpus_per_node=8, network_bits_per_s=400 * GBIT,
                  fabric="Meta 24K-GPU RoCE cluster: Grand Teton servers of 8 H100 (80GB HBM3, 700 W) on NVLink; "
                         "400 Gb/s per GPU through a three-layer Clos, pods of 3,072 GPUs at full bisection, "
                         "1:7 oversubscribed between pods",
                  source="Dubey et al. 2024, The Llama 3 Herd of Models (arXiv 2407.21783), section 3.3.1"),
    ClusterFabric(name="mcore-h100-ib", gpu="h100", gpus_per_node=8, network_bits_per_s=400 * GBIT,
                  fabric="8x H100 80GB HBM3 per server on 4th-generation NVLink, InfiniBand 8 x 400 Gb/s",
                  source="NVIDIA Megatron-LM MoE README (megatron/core/transformer/moe/README.md, 2024-08-02), "
                         "'Detailed Benchmark Information'"),
)}
