#!/usr/bin/env python3
"""TTFT of a long prompt: cold, with its KV in the host tier, and from the disk tier after a
server restart, through `strata serve` over HTTP (so the same command runs on a GPU machine with
extra serve flags, e.g. --serve-args "--device cuda --load-format dummy").

Each round, with a fresh prompt:
  cold   the prompt on a server that has never seen it;
  tail   the same prompt again, every full block in the device pool: the prefill of the
         uncached tail plus the request's overhead;
  host   after another prompt of the same length pushed it out of the pool (sized for about
         1.5 prompts) into the host tier;
  disk   after a SIGTERM (the pool's cached blocks go to disk), a restart with the tier files
         dropped from the page cache (posix_fadvise DONTNEED), so the blocks are read from the
         device, and one short unrelated warm-up request (--warmup-tokens).
The disk's sequential read bandwidth is measured in the same run on a file in the tier's
directory, also read with its pages dropped first. Printed against the targets:
  host hit TTFT <= 10% of cold TTFT;
  disk hit TTFT <= 1.25 x (KV bytes / read bandwidth) + tail TTFT.
"""
import argparse
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def drop_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def files_read_bandwidth(paths, nbytes):
    """Bytes/s of reading existing files (page cache dropped before and after) up to nbytes: the
    disk's read rate at this moment, without writing a probe file that would load it."""
    total, t0 = 0, time.perf_counter()
    for path in paths:
        if total >= nbytes:
            break
        if not os.path.exists(path):  # evicted or quarantined by the restarted server
            continue
        drop_page_cache(path)
        with open(path, "rb", buffering=0) as f:
            while True:
                b = f.read(8 << 20)
                if not b:
                    break
                total += len(b)
        drop_page_cache(path)
    dt = time.perf_counter() - t0
    return (total / dt if dt > 0 else 0.0), total


def read_bandwidth(directory, nbytes):
    """Bytes/s of a sequential read of a fresh nbytes file whose pages were dropped first."""
    path = os.path.join(directory, "bandwidth.probe")
    chunk = os.urandom(4 << 20)
    with open(path, "wb") as f:
        written = 0
        while written < nbytes:
            f.write(chunk)
            written += len(chunk)
        f.flush()
        os.fsync(f.fileno())
    drop_page_cache(path)
    t0 = time.perf_counter()
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                break
            total += len(b)
    dt = time.perf_counter() - t0
    os.remove(path)
    return total / dt, total, dt


class Server:
    def __init__(self, args, disk_dir, kv_cache_bytes, log_path):
        cmd = [args.strata, "serve", "--model", args.model, "--port", "0", "--kv-disk-dir", disk_dir,
               "--kv-host-bytes", str(args.kv_host_bytes)]
        if kv_cache_bytes:
            cmd += ["--kv-cache-bytes", str(kv_cache_bytes)]
        cmd += shlex.split(args.serve_args)
        self.cmd = cmd
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.port = None
        deadline = time.time() + args.start_timeout
        while time.time() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.proc.kill()
            self.log.close()
            sys.exit("strata serve did not start: " + " ".join(cmd) + "\n" + open(log_path).read()[-2000:])
        # "listening" is printed just before the listener runs: wait until it answers, so a
        # SIGTERM sent next cannot arrive before it.
        while True:
            try:
                urllib.request.urlopen(self.url("/health"), timeout=5).read()
                break
            except Exception:
                if time.time() > deadline or self.proc.poll() is not None:
                    sys.exit("strata serve does not answer /health")
                time.sleep(0.05)
        self.bytes_per_token = None
        for line in open(log_path):
            m = re.search(r"\((\d+) bytes/token\)", line)
            if m:
                self.bytes_per_token = int(m.group(1))

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=600)
        self.log.close()
        if rc != 0:
            sys.exit(f"strata serve exited with {rc} after SIGTERM")

    def metric(self, name, tier):
        text = urllib.request.urlopen(self.url("/metrics"), timeout=30).read().decode()
        for line in text.splitlines():
            if line.startswith(name + "{") and f'tier="{tier}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def engine_ttft_sum(self):
        """Seconds of submission-to-first-token summed over the server's requests (its histogram)."""
        text = urllib.request.urlopen(self.url("/metrics"), timeout=30).read().decode()
        for line in text.splitlines():
            if line.startswith("strata_time_to_first_token_seconds_sum"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


def ttft(server, model_name, prompt, timeout):
    """(seconds to the first streamed token, cached prompt tokens) of a streamed completion."""
    return ttft_split(server, model_name, prompt, timeout)[:2]


def ttft_split(server, model_name, prompt, timeout):
    """ttft() and the engine's own part of it: seconds from submission to the first token (the
    rest is HTTP, the request's parsing and the client)."""
    before = server.engine_ttft_sum()
    first, cached = ttft_plain(server, model_name, prompt, timeout)
    return first, cached, server.engine_ttft_sum() - before


def ttft_plain(server, model_name, prompt, timeout):
    body = json.dumps({"model": model_name, "prompt": prompt, "max_tokens": 2, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(server.url("/v1/completions"), data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = None
    cached = None
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if first is None and ev.get("choices") and ev["choices"][0].get("text"):
                first = time.perf_counter() - t0
            usage = ev.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    if first is None:
        first = time.perf_counter() - t0
    return first, cached


def model_name_of(server):
    d = json.load(urllib.request.urlopen(server.url("/v1/models"), timeout=30))
    return d["data"][0]["id"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strata", default=os.path.join(here, "..", "build", "strata"), help="strata binary")
    p.add_argument("--model", default=os.path.join(here, "..", "models", "strata-demo"))
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--vocab", type=int, default=0, help="token ids drawn below this (default: config.json's vocab_size)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup-tokens", type=int, default=64, help="length of the unrelated request after each restart")
    p.add_argument("--kv-host-bytes", type=int, default=4 << 30)
    p.add_argument("--pool-prompts", type=float, default=1.5, help="device pool size in prompts' KV")
    p.add_argument("--serve-args", default="", help="extra strata serve flags")
    p.add_argument("--work-dir", default=None, help="where the disk tier lives (default: a temporary directory)")
    p.add_argument("--probe-bytes", type=int, default=1 << 30, help="size of the bandwidth probe file")
    p.add_argument("--settle-s", type=float, default=0.0,
                   help="seconds to wait after each restart before the disk hit (the disk finishes absorbing the "
                        "shutdown's writes)")
    p.add_argument("--start-timeout", type=float, default=600)
    p.add_argument("--timeout", type=float, default=1800, help="seconds one request may take")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--log-dir", default=None, help="copy the servers' logs here before the work directory goes")
    args = p.parse_args()
    args.strata = os.path.abspath(args.strata)
    vocab = args.vocab or json.load(open(os.path.join(args.model, "config.json")))["vocab_size"]

    work = tempfile.mkdtemp(prefix="strata_kv_tier_bench_", dir=args.work_dir)
    disk_dir = os.path.join(work, "kv")
    os.makedirs(disk_dir)
    try:
        bw, probe_bytes, probe_s = read_bandwidth(disk_dir, args.probe_bytes)
        print(f"disk sequential read: {probe_bytes / 2**20:.0f} MiB in {probe_s:.3f} s = {bw / 2**20:.0f} MiB/s "
              f"(page cache dropped)")
        # A first start learns the KV bytes per token to size the pool.
        probe = Server(args, disk_dir, 0, os.path.join(work, "probe.log"))
        bpt = probe.bytes_per_token
        probe.stop()
        shutil.rmtree(disk_dir)
        os.makedirs(disk_dir)
        if not bpt:
            sys.exit("could not read the KV bytes per token from the server log")
        pool_bytes = int(args.pool_prompts * args.prompt_tokens * bpt)
        rng = random.Random(1234)
        rounds = []
        server = Server(args, disk_dir, pool_bytes, os.path.join(work, "serve0.log"))
        name = model_name_of(server)
        print(f"model {name}: {bpt} KV bytes/token, prompt {args.prompt_tokens} tokens = "
              f"{args.prompt_tokens * bpt / 2**20:.1f} MiB of KV, pool {pool_bytes / 2**20:.1f} MiB")
        print("serve: " + " ".join(shlex.quote(c) for c in server.cmd))
        for r in range(args.rounds):
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
            other = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
            cold, cached_cold, cold_engine = ttft_split(server, name, prompt, args.timeout)
            tail, cached_tail, tail_engine = ttft_split(server, name, prompt, args.timeout)
            ttft(server, name, other, args.timeout)  # pushes `prompt` out of the pool
            host_before = server.metric("strata_kv_tier_hit_blocks_total", "host")
            host, cached_host, host_engine = ttft_split(server, name, prompt, args.timeout)
            host_blocks = server.metric("strata_kv_tier_hit_blocks_total", "host") - host_before
            server.stop()  # SIGTERM: the pool's cached blocks and the writer queue go to disk
            # The full blocks' files and those of the window and state tiers (window/, state/).
            files = [os.path.join(d, f) for d, _, names in os.walk(disk_dir) for f in names if f.endswith(".kvb")]
            for f in files:
                drop_page_cache(f)
            server = Server(args, disk_dir, pool_bytes, os.path.join(work, f"serve{r + 1}.log"))
            # A short unrelated request first: the new process's one-time costs (weights paged
            # in, threads started) are not the tier's. A long one fills the pool, and the disk hit
            # then also pays for demoting its blocks (host copy, disk writes beside the reads).
            ttft(server, name, [rng.randrange(3, vocab) for _ in range(args.warmup_tokens)], args.timeout)
            if args.settle_s > 0:
                time.sleep(args.settle_s)
            # The read rate right before the hit (the shutdown just wrote the pool's blocks): tells
            # a disk still busy with those writes from a slow read path.
            bw_now, now_bytes = files_read_bandwidth(sorted(files, key=os.path.getsize, reverse=True), args.probe_bytes)
            disk, cached_disk = ttft(server, name, prompt, args.timeout)
            disk_blocks = server.metric("strata_kv_tier_hit_blocks_total", "disk")
            kv_bytes = cached_disk * bpt
            bound = 1.25 * kv_bytes / bw + tail
            row = dict(round=r, cold_s=cold, tail_s=tail, host_s=host, disk_s=disk, cached_cold=cached_cold,
                       cached_tail=cached_tail, cached_host=cached_host, cached_disk=cached_disk,
                       host_hit_blocks=host_blocks, disk_hit_blocks=disk_blocks, kv_bytes=kv_bytes,
                       host_ratio=host / cold, disk_bound_s=bound, disk_ratio=disk / bound,
                       cold_engine_s=cold_engine, tail_engine_s=tail_engine, host_engine_s=host_engine,
                       settle_s=args.settle_s, read_bandwidth_at_hit=bw_now,
                       disk_bound_at_hit_s=(1.25 * kv_bytes / bw_now + tail) if bw_now > 0 else None)
            rounds.append(row)
            print(f"round {r}: cold {cold * 1e3:.1f} ms | tail (all cached in pool) {tail * 1e3:.1f} ms | "
                  f"host hit {host * 1e3:.1f} ms ({cached_host} cached, {host_blocks:.0f} host blocks) | "
                  f"disk hit after restart {disk * 1e3:.1f} ms ({cached_disk} cached, {disk_blocks:.0f} disk blocks)")
            print(f"  host/cold = {row['host_ratio']:.3f} (target <= 0.10: {'met' if row['host_ratio'] <= 0.10 else 'NOT met'})")
            print(f"  in the engine (submission to first token): cold {cold_engine * 1e3:.1f} ms, tail {tail_engine * 1e3:.1f} ms, "
                  f"host hit {host_engine * 1e3:.1f} ms; the rest is HTTP, parsing and the client")
            print(f"  disk bound = 1.25 x {kv_bytes / 2**20:.1f} MiB / {bw / 2**20:.0f} MiB/s + {tail * 1e3:.1f} ms = "
                  f"{bound * 1e3:.1f} ms; disk/bound = {row['disk_ratio']:.2f} "
                  f"(target <= 1: {'met' if row['disk_ratio'] <= 1.0 else 'NOT met'})")
            if bw_now > 0:
                print(f"  disk read rate just before the hit ({args.settle_s:.0f} s after the restart; "
                      f"{now_bytes / 2**20:.0f} MiB of tier files): {bw_now / 2**20:.0f} MiB/s; "
                      f"disk hit / bound at that rate = {disk / row['disk_bound_at_hit_s']:.2f}")
        server.stop()
        result = dict(date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), host=os.uname().nodename,
                      command=" ".join(shlex.quote(a) for a in sys.argv), model=args.model,
                      prompt_tokens=args.prompt_tokens, kv_bytes_per_token=bpt, read_bandwidth=bw, rounds=rounds)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            for f in os.listdir(work):
                if f.endswith(".log"):
                    shutil.copy(os.path.join(work, f), os.path.join(args.log_dir, f))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
