#!/usr/bin/env python3
"""A reference model of DTS's update rule in NumPy, without a network.

Four workers (by default) train the mlp (784-256-10, ReLU, PyTorch's
default initialization) on their strided shards of Fashion-MNIST with SGD
(lr 0.05, momentum 0.9, batch 64), and exchange their progress exactly as
docs/architecture.md section 3 specifies for a fixed D and the identity
codec: round r covers K steps; D steps after its close every worker
replaces its own contribution by the mean, x <- x + q_i - mean_j q_j. Every
`--every` steps the mean model is evaluated on the test set; the script
prints the first step at which it reached 85% and the accuracy at the end.

It isolates the update rule from everything else (links, timing, codecs,
eager application): K = 1, D = 0 is synchronous SGD, and what a delay costs
in steps is the rule's own cost. Options beyond the rule:
  --lr-scale S    the step under a delay: the gradient times S (the worker's
                  rule, sync.scaleLrWithDelay, takes max(1/2, 4 / staleness))
  --fade F        the correction applied a fraction F of what remains per
                  step instead of at once (tried, not kept: docs/benchmarks.md)
  --nesterov      Nesterov momentum (training.nesterov, the worker's default):
                  each step is lr (g + momentum v) with v = momentum v + g
Diagnostics and variants of the rule (tried, not kept: docs/benchmarks.md).
Tensors are numbered 0-3: the first layer's weight and bias, the second's.
  --oracle 0,1    take the gradient of these tensors at the mean model of all
                  workers instead of the worker's own (no worker can: it does
                  not know its peers' last D + K steps). It shows which
                  tensors' drift from the mean costs the steps.
  --own W,W,W,W   per tensor, the weight of the worker's own steps not yet
                  averaged in the point the gradient is taken at (1: the rule)
  --tensor-scale S,S,S,S
                  per tensor, a factor on the gradient (on top of --lr-scale)
  --late W        each step also takes the gradient at the mean model, and
                  W times the difference (through its own momentum) is
                  subtracted from every worker's model when the round's mean
                  is applied. It is the exact form of any compensation a
                  worker could apply once it knows the mean (DC-ASGD's
                  g * g * (mean - own) is an estimate of it), at the earliest
                  moment it could, so it bounds what such a late fix can do.

Needs python3-numpy and the dataset-fashion-mnist package. One run of 1000
steps takes about ten seconds on one core.

  bench/dts_reference_sim.py --period 16 --delay 32 --seed 1
  bench/dts_reference_sim.py --period 16 --delay 32 --seed 1 --lr-scale 0.5
  bench/dts_reference_sim.py --period 32 --delay 32 --seed 1 --lr-scale 0.5 --nesterov
  bench/dts_reference_sim.py -K 32 -D 32 --lr-scale 0.5 --nesterov --oracle 0,1
"""
import argparse
import gzip
import sys

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist/"


def load(split):
    prefix = "train" if split == "train" else "t10k"
    try:
        with gzip.open(f"{DATA}{prefix}-images-idx3-ubyte.gz") as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
        with gzip.open(f"{DATA}{prefix}-labels-idx1-ubyte.gz") as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)
    except OSError as e:
        sys.exit(f"dts_reference_sim.py: {e} (apt-get install dataset-fashion-mnist)")
    # The worker's normalization (worker/train/dataset.cc).
    return ((x / 255.0 - 0.2860) / 0.3530).astype(np.float32), y.astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--period", "-K", type=int, default=1, help="K: steps per round (>= 1)")
    ap.add_argument("--delay", "-D", type=int, default=0, help="D: steps a round stays in flight (>= 0)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--lr-scale", type=float, default=1.0, help="factor on the gradient (0, 1]")
    ap.add_argument("--fade", type=float, default=1.0, help="share of the correction applied per step (0, 1]")
    ap.add_argument("--nesterov", action="store_true", help="Nesterov momentum (PyTorch's form)")
    ap.add_argument("--every", type=int, default=25, help="evaluate the mean model every N steps")
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--oracle", default="", help="tensors (0-3) whose gradient is taken at the mean model")
    ap.add_argument("--own", default="1,1,1,1", help="per tensor, the weight of the own steps not yet averaged")
    ap.add_argument("--tensor-scale", default="1,1,1,1", help="per tensor, a factor on the gradient")
    ap.add_argument("--late", type=float, default=0.0, help="weight of the exact late correction [0, 1]")
    a = ap.parse_args()
    try:
        oracle = sorted({int(v) for v in a.oracle.split(",") if v})
        own = [float(v) for v in a.own.split(",")]
        tensorScale = [float(v) for v in a.tensor_scale.split(",")]
    except ValueError as e:
        ap.error(f"--oracle, --own, --tensor-scale: {e}")
    for name, ok in (("--period", a.period >= 1), ("--delay", a.delay >= 0), ("--workers", a.workers >= 1),
                     ("--steps", a.steps >= 1), ("--lr-scale", 0 < a.lr_scale <= 1), ("--fade", 0 < a.fade <= 1),
                     ("--every", a.every >= 1), ("--late", 0 <= a.late <= 1), ("--oracle", all(0 <= k < 4 for k in oracle)),
                     ("--own", len(own) == 4 and all(0 <= w <= 1 for w in own)),
                     ("--tensor-scale", len(tensorScale) == 4 and all(0 < f <= 4 for f in tensorScale))):
        if not ok:
            ap.error(f"{name}: out of range (see --help)")

    xtr, ytr = load("train")
    xte, yte = load("test")
    rng = np.random.default_rng(a.seed)
    b1, b2 = 1 / np.sqrt(784), 1 / np.sqrt(256)
    x0 = [rng.uniform(-b1, b1, (784, 256)), rng.uniform(-b1, b1, 256),
          rng.uniform(-b2, b2, (256, 10)), rng.uniform(-b2, b2, 10)]
    x0 = [p.astype(np.float32) for p in x0]
    M = a.workers
    zeros = lambda: [np.zeros_like(p) for p in x0]
    X = [[p.copy() for p in x0] for _ in range(M)]  # models
    V = [zeros() for _ in range(M)]                  # momentum buffers (local)
    acc = [zeros() for _ in range(M)]                # own progress in the open round
    fade = [zeros() for _ in range(M)]               # correction not yet applied
    shards = [np.arange(i, len(xtr), M) for i in range(M)]
    order = [rng.permutation(s) for s in shards]
    pos = [0] * M
    inflight = {}
    # --late: the correction's momentum, its sum over the open round, and the
    # closed rounds' mean corrections until their mean is applied.
    lateV = [zeros() for _ in range(M)]
    lateAcc = [zeros() for _ in range(M)]
    lateInflight = {}

    def batch(i):
        if pos[i] + 64 > len(order[i]):
            order[i], pos[i] = rng.permutation(shards[i]), 0
        idx = order[i][pos[i]:pos[i] + 64]
        pos[i] += 64
        return xtr[idx], ytr[idx]

    def grad(p, xb, yb):
        w1, c1, w2, c2 = p
        h = xb @ w1 + c1
        r = np.maximum(h, 0)
        z = r @ w2 + c2
        e = np.exp(z - z.max(1, keepdims=True))
        s = e / e.sum(1, keepdims=True)
        s[np.arange(len(yb)), yb] -= 1
        s /= len(yb)
        dr = s @ w2.T
        dr[h <= 0] = 0
        return [xb.T @ dr, dr.sum(0), r.T @ s, s.sum(0)]

    def accuracy(p):
        w1, c1, w2, c2 = p
        return float(((np.maximum(xte @ w1 + c1, 0) @ w2 + c2).argmax(1) == yte).mean())

    first, last = None, 0.0
    for t in range(1, a.steps + 1):
        # The mean model before this step, for --oracle and --late: taken
        # once, so that no worker's gradient point includes a step its peers
        # took in the same step.
        meanModel = [sum(X[j][k] for j in range(M)) / M for k in range(4)] if oracle or a.late else None
        for i in range(M):
            if a.fade < 1:
                for k in range(4):
                    X[i][k] += a.fade * fade[i][k]
                    fade[i][k] *= 1 - a.fade
            point = X[i]
            if oracle:
                point = [meanModel[k] if k in oracle else point[k] for k in range(4)]
            if any(w != 1 for w in own):
                # The own steps not yet averaged: the open round and the own
                # contributions of the rounds in flight.
                point = [point[k] - (1 - own[k]) * (acc[i][k] + sum(q[i][k] for q in inflight.values()))
                         for k in range(4)]
            xb, yb = batch(i)
            g = [gk * f for gk, f in zip(grad(point, xb, yb), tensorScale)]
            if a.late:
                # The step the gradient at the mean model would have taken,
                # less the one taken; the momentum is linear, so it has its own.
                gMean = grad(meanModel, xb, yb)
                for k in range(4):
                    e = a.lr_scale * (gMean[k] * tensorScale[k] - g[k])
                    lateV[i][k] = a.momentum * lateV[i][k] + e
                    lateAcc[i][k] += a.late * a.lr * (e + a.momentum * lateV[i][k] if a.nesterov else lateV[i][k])
            for k in range(4):
                V[i][k] = a.momentum * V[i][k] + a.lr_scale * g[k]
                # PyTorch's SGD: Nesterov steps along g + momentum * v.
                step = a.lr * (a.lr_scale * g[k] + a.momentum * V[i][k] if a.nesterov else V[i][k])
                X[i][k] -= step
                acc[i][k] += step
        if t % a.period == 0:  # a round closes: its contributions leave
            inflight[t] = [[q.copy() for q in acc[i]] for i in range(M)]
            acc = [zeros() for _ in range(M)]
            if a.late:
                lateInflight[t] = [sum(lateAcc[i][k] for i in range(M)) / M for k in range(4)]
                lateAcc = [zeros() for _ in range(M)]
        due = t - a.delay
        if due in inflight:  # D steps later: own contribution -> the mean
            q = inflight.pop(due)
            mean = [sum(q[i][k] for i in range(M)) / M for k in range(4)]
            for i in range(M):
                for k in range(4):
                    (fade if a.fade < 1 else X)[i][k] += q[i][k] - mean[k]
            if due in lateInflight:
                c = lateInflight.pop(due)
                for i in range(M):
                    for k in range(4):
                        X[i][k] -= c[k]
        if t % a.every == 0:
            last = accuracy([sum(X[i][k] for i in range(M)) / M for k in range(4)])
            if first is None and last >= a.target:
                first = t
    print(f"K={a.period} D={a.delay} lr-scale={a.lr_scale:g} fade={a.fade:g} "
          f"nesterov={'yes' if a.nesterov else 'no'} seed={a.seed}"
          + (f" oracle={a.oracle}" if oracle else "") + (f" own={a.own}" if any(w != 1 for w in own) else "")
          + (f" tensor-scale={a.tensor_scale}" if any(f != 1 for f in tensorScale) else "")
          + (f" late={a.late:g}" if a.late else "") + ": "
          f"{a.target:.0%} at step {first if first else '-'}, {last:.2%} at step {a.steps}")


if __name__ == "__main__":
    main()
