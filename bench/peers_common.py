"""What the same-process peer scripts share (bench/peers_w4.py, peers_serving_w4.py,
peers_deepgemm.py): the peer's absence as an exception, the line that says which peer runs, a
row's per-side figures, and the scripts' end (the CPU smoke run without CUDA, the GPU run with it, the JSON rows, the exit
status)."""
import json

import torch


class PeerMissing(Exception):
    """The peer cannot be imported or lacks what the script calls: groupmm is timed alone."""


def peer_status(args, label, load_peer, describe):
    """(peer adapter or None, a line saying which peer runs, or why none)."""
    if args.groupmm_only:
        return None, f"peer {label}: not run (--groupmm-only)"
    try:
        p = load_peer()
    except PeerMissing as e:
        return None, f"peer {label}: missing ({e}); timing groupmm alone"
    return p, f"peer {label} {describe(p)}"


def record_times(row, us, flops, nbytes, copy_bps, fraction_key="copy_fraction"):
    """Each side's time (us) into row as <side>_us, <side>_tflops and <side>_<fraction_key> (the
    bytes moved as a fraction of the copy bandwidth), and ratio = peer / groupmm when both ran."""
    for side, t in us.items():
        row[f"{side}_us"] = t
        row[f"{side}_tflops"] = flops / t * 1e-6
        row[f"{side}_{fraction_key}"] = nbytes / (t * 1e-6) / copy_bps
    if "groupmm_us" in row and "peer_us" in row:
        row["ratio"] = row["peer_us"] / row["groupmm_us"]


def finish(args, label, smoke, run_gpu, load_peer, **cpu_meta):
    """Runs the script: without CUDA smoke(args) (rows) and a line on whether the peer would have
    been importable; with CUDA run_gpu(args) -> (rows, meta, failed). Writes --json and returns
    the exit status (1 when a row failed)."""
    if not torch.cuda.is_available():
        rows = smoke(args)
        failed = not all(r["ok"] for r in rows)
        if not args.groupmm_only:
            try:
                load_peer()
                why = "importable, but no CUDA device"
            except PeerMissing as e:
                why = f"no CUDA device; {e}"
            print(f"peer {label}: unavailable ({why})")
        meta = dict(device="cpu", torch=torch.__version__, smoke=True, **cpu_meta)
    else:
        rows, meta, failed = run_gpu(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(meta, rows=rows), f, indent=1)
    return 1 if failed else 0
