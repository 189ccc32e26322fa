"""A Jupyter kernel for the course that forks from one preloaded process, so ten open chapters fit Binder.

Why: a kernel that has imported torch, matplotlib, ipywidgets and the course
holds about 260 MB of its own memory before it runs anything, so the ten
kernels of a learner who opens chapter after chapter (JupyterLab keeps a
kernel running when its tab closes) need 2.6 GB: past Binder's 2 GiB, where
the kernel OOM killer takes the earlier chapters' kernels.

How: the first kernel started by a Jupyter server starts a *zygote*, a
process that imports all of that once and then only forks. Every kernel is a
fork of it, so the imported pages are shared copy-on-write and each kernel
pays only for what its notebook computes. The process Jupyter starts and
watches is a small *launcher* (no torch): it asks the zygote for a kernel,
forwards Jupyter's signals (interrupt, terminate) to it and exits with its
exit status; the kernel ends when its launcher ends, however it ends.

- launcher.py: the process Jupyter runs (`python -m wmdist.kernel -f {connection_file}`);
  it falls back to a plain ipykernel when no zygote can be had.
- zygote.py: the preloading, forking server, one per Jupyter server.
- spec.py: the kernelspec (`python -m wmdist.kernel install`), used by `wmdist lab` and binder/postBuild.

`WMDIST_KERNEL_ZYGOTE=0` makes the launcher start a plain ipykernel.
"""
