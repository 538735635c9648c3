"""A zoo of small PyTorch training loops written the way people write them, NOT
for optcheck and without its GPT or helpers: an MLP, a small ResNet-style CNN, a
char-level LSTM, a GPT-ish model with gradient accumulation and bf16 autocast, a
frozen-embedding classifier with param groups, a regression with checkpoints, a
contrastive (two views) encoder, a DCGAN-style GAN, a leaky loop and a
matrix factorisation with sparse embedding gradients.

Each ``train_*(bug=None, monitor=None, steps=N)`` trains on synthetic or stdlib
text data and returns ``(losses, mon)``. ``monitor`` is a dict of
``optcheck.Monitor`` keyword arguments (None: run without optcheck); the only
optcheck lines are marked ``# optcheck``. ``bug`` plants one ordinary mistake
(the names are the keys of :data:`BUGS`). Every loop is tiny (< 100 K
parameters, <= 100 steps) and deterministic for a given seed.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import sysconfig
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


def _monitor(model, opt, monitor):
    """The user's one line: a Monitor when asked for, else a no-op context."""
    if monitor is None:
        return contextlib.nullcontext(None)
    import optcheck

    return optcheck.Monitor(model, opt, **monitor)  # optcheck


def _text(n=40_000):
    raw = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_bytes()[:n]
    return torch.tensor(list(raw), dtype=torch.long)


# --------------------------------------------------------------------------- 1. MLP + SGD
class MLP(nn.Module):
    def __init__(self, n_in=20, hidden=64, n_cls=4, extra=False):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc = nn.Linear(hidden, n_cls)
        if extra:
            self.aux_head = nn.Linear(hidden, n_cls)  # planned auxiliary head, never wired in

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc(x)


def blobs(n, n_in=20, n_cls=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_cls, n_in, generator=g) * 2
    y = torch.randint(0, n_cls, (n,), generator=g)
    x = centers[y] + torch.randn(n, n_in, generator=g)
    return x, y


def train_mlp(bug=None, monitor=None, steps=60, seed=0):
    """SGD + momentum + Nesterov, weight decay, StepLR, ``model.zero_grad()``, ``with Monitor``."""
    torch.manual_seed(seed)
    X, Y = blobs(2048, seed=seed)
    model = MLP(extra=(bug == "unused-layer"))
    lr = 50.0 if bug == "exploding-lr" else 0.05
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for it in range(steps):
            idx = torch.randint(0, len(X), (64,))
            xb, yb = X[idx], Y[idx]
            if bug == "module-swapped" and it == 20:
                model.fc = nn.Linear(64, 4)  # "re-initialise the classifier head"
            if bug == "half-after-state" and it >= 20:
                model.half()  # "save memory from here on"
                xb = xb.half()
            if bug != "missing-zero-grad":
                model.zero_grad()
            out = model(xb)
            loss = F.cross_entropy(out, yb)
            loss.backward()
            opt.step()
            if bug == "double-step":
                opt.step()
            sched.step()
            losses.append(loss.item())
    return losses, mon


# --------------------------------------------------------------------------- 2. small CNN
class BasicBlock(nn.Module):
    """torchvision-style: ``out += identity`` and in-place ReLU."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class SmallCNN(nn.Module):
    def __init__(self, n_cls=3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True))
        self.block = BasicBlock(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.2)
        self.classifier = nn.Linear(8, n_cls)

    def forward(self, x):
        x = self.block(self.stem(x))
        x = torch.flatten(self.pool(x), 1)
        return self.classifier(self.drop(x))


def shapes_dataset(n, seed=0):
    """12x12 images: a bright bar, horizontal (0), vertical (1) or a blob (2), plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, 12, 12, generator=g)
    for i in range(n):
        r, c = torch.randint(2, 10, (2,), generator=g).tolist()
        if y[i] == 0:
            x[i, 0, r, 1:11] += 1.5
        elif y[i] == 1:
            x[i, 0, 1:11, c] += 1.5
        else:
            x[i, 0, r - 1:r + 2, c - 1:c + 2] += 1.5
    return x, y


def train_cnn(bug=None, monitor=None, steps=40, seed=0):
    """AdamW, BatchNorm + Dropout, an eval pass (``model.eval()`` + ``no_grad``) every
    10 steps then ``model.train()``; explicit ``mon.step(loss)`` and ``mon.close()``."""
    torch.manual_seed(seed)
    X, Y = shapes_dataset(512, seed)
    Xv, Yv = shapes_dataset(128, seed + 1)
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)
    mon = _monitor(model, optimizer, monitor).__enter__()
    losses, accs = [], []
    best, best_acc = None, -1.0
    dtype = torch.float32
    for step in range(1, steps + 1):
        model.train()
        i = torch.randint(0, len(X), (32,))
        x, y = X[i].to(dtype), Y[i]
        if bug == "double-after-state" and step == 15:
            model.double()  # "more precision for the second phase"
            dtype = torch.float64
            x = x.to(dtype)
        optimizer.zero_grad()
        if bug == "forward-under-no-grad" and step >= 5:
            with torch.no_grad():  # copied from the eval helper
                logits = model(x)
        else:
            logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        if bug == "zero-grad-between":
            optimizer.zero_grad()
        optimizer.step()
        if mon is not None:
            mon.step(loss)  # optcheck
        losses.append(loss.item())
        if step % 10 == 0:
            model.eval()
            with torch.no_grad():
                pred = model(Xv.to(dtype)).argmax(1)
                accs.append((pred == Yv).float().mean().item())
            if accs[-1] > best_acc:
                best, best_acc = copy.deepcopy(model), accs[-1]  # keep the best model
            model.train()
    if mon is not None:
        mon.close()  # optcheck
    return losses, mon


# --------------------------------------------------------------------------- 3. char LSTM, truncated BPTT
class CharLSTM(nn.Module):
    def __init__(self, vocab=256, emb=24, hidden=48, squash=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, emb)
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, vocab)
        self.squash = squash

    def forward(self, x, state=None):
        e = self.embed(x)
        out, state = self.lstm(e, state)
        if self.squash:
            h = torch.tanh(out)
            h.mul_(0.5)  # tanh saved its output for backward
            out = h
        return self.proj(out), state


def train_lstm(bug=None, monitor=None, steps=40, seed=0):
    """Adam, hidden state carried across batches with ``.detach()``, ``clip_grad_norm_``."""
    torch.manual_seed(seed)
    data = _text()
    B, T = 8, 16
    n = (len(data) - 1) // B
    streams = data[:B * n + 1]
    xs = streams[:-1].view(B, n)
    ys = streams[1:].reshape(B, n)
    model = CharLSTM(squash=(bug == "inplace-tanh"))
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    hidden = None
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for i in range(steps):
            s = (i * T) % (n - T)
            if s == 0:
                hidden = None
            x, y = xs[:, s:s + T], ys[:, s:s + T]
            if hidden is not None:
                hidden = tuple(h.detach() for h in hidden)
            logits, hidden = model(x, hidden)
            loss = F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
            opt.zero_grad()
            loss.backward()
            if bug == "grad-of-intermediate" and i % 10 == 0:
                g = logits.grad  # "look at the gradient of the logits"
                losses.append(float("nan") if g is None else g.norm().item())
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if bug != "missing-step":
                opt.step()
            losses.append(loss.item())
    return losses, mon


# --------------------------------------------------------------------------- 4. GPT-ish, accumulation, bf16
class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).contiguous().view(B, T, C))


class GatedMLP(nn.Module):
    def __init__(self, d, exp_gate=False):
        super().__init__()
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.exp_gate = exp_gate

    def forward(self, x):
        h = self.up(x)
        if self.exp_gate:
            g = torch.exp(h)
            g.add_(1)  # exp saved its output for backward
            h = h / g
        else:
            h = F.gelu(h)
        return self.down(h)


class Block(nn.Module):
    def __init__(self, d, n_head, exp_gate=False):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.mlp = GatedMLP(d, exp_gate)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MiniGPT(nn.Module):
    def __init__(self, vocab=256, d=32, n_head=4, n_layer=2, ctx=32, exp_gate=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d, n_head, exp_gate) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def train_gpt(bug=None, monitor=None, steps=20, seed=0, accum=4):
    """AdamW with decay/no-decay groups, LambdaLR warm-up, 4 micro-batches per step,
    ``autocast(bfloat16)`` on CPU, ``zero_grad(set_to_none=True)`` after the step."""
    torch.manual_seed(seed)
    data = _text()
    ctx = 32
    model = MiniGPT(exp_gate=(bug == "inplace-exp"))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    warmup = 5
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup))
    gen = torch.Generator().manual_seed(seed)

    def get_batch():
        ix = torch.randint(len(data) - ctx - 1, (4,), generator=gen)
        return (torch.stack([data[i:i + ctx] for i in ix]), torch.stack([data[i + 1:i + ctx + 1] for i in ix]))

    losses = []
    with _monitor(model, opt, monitor) as mon:
        for step in range(steps):
            total = 0.0
            for micro in range(accum):
                x, y = get_batch()
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    _, loss = model(x, y)
                loss = loss / accum
                if bug == "loss-detached" and step >= 3:
                    loss = loss.detach()  # "avoid keeping the graph around"
                total += loss.item()
                loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            losses.append(total)
    return losses, mon


# --------------------------------------------------------------------------- 5. frozen embedding, param groups
class TextClassifier(nn.Module):
    def __init__(self, vocab=256, d=32, n_cls=2):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d)
        self.encoder = nn.Sequential(nn.Linear(d, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, n_cls)

    def forward(self, tokens):
        e = self.embedding(tokens).mean(dim=1)
        return self.head(self.norm(self.encoder(e)))


def train_frozen(bug=None, monitor=None, steps=50, seed=0, optim="adam"):
    """Pretrained (frozen) embedding, optimizer over ``filter(lambda p: p.requires_grad, ...)``
    or two param groups with different lr; Adam(amsgrad=True) / RMSprop / Adagrad."""
    torch.manual_seed(seed)
    data = _text()
    model = TextClassifier()
    model.embedding.weight.data.normal_(0, 1)  # "pretrained"
    model.embedding.weight.requires_grad_(False)
    if bug == "optimizer-missing-module":
        groups = [{"params": model.encoder.parameters(), "lr": 1e-3},
                  {"params": model.head.parameters(), "lr": 5e-3}]  # forgot model.norm
    elif optim == "adam":
        groups = [{"params": model.encoder.parameters(), "lr": 1e-3},
                  {"params": list(model.norm.parameters()) + list(model.head.parameters()), "lr": 5e-3}]
    else:
        groups = filter(lambda p: p.requires_grad, model.parameters())
    if optim == "adam":
        opt = torch.optim.Adam(groups, lr=1e-3, amsgrad=True)
    elif optim == "rmsprop":
        opt = torch.optim.RMSprop(groups, lr=1e-3, alpha=0.9, momentum=0.5)
    else:
        opt = torch.optim.Adagrad(groups, lr=0.05)
    g = torch.Generator().manual_seed(seed)
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for _ in range(steps):
            ix = torch.randint(0, len(data) - 16, (32,), generator=g)
            tokens = torch.stack([data[i:i + 16] for i in ix])
            labels = (tokens == ord(" ")).sum(1).gt(2).long()
            opt.zero_grad()
            loss = F.cross_entropy(model(tokens), labels)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, mon


# --------------------------------------------------------------------------- 6. regression, checkpoints
class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU())
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(self.body(x)).squeeze(-1)


def train_regression(bug=None, monitor=None, steps=60, seed=0):
    """RMSprop, a validation loss computed without ``no_grad`` (forward only) every 5
    steps, a checkpoint saved at step 20 and reloaded at step 30 (model and optimizer)."""
    torch.manual_seed(seed)
    w = torch.randn(8)
    X = torch.randn(1024, 8)
    Y = torch.sin(X @ w) + 0.05 * torch.randn(1024)
    Xv, Yv = X[-128:], Y[-128:]
    net = Regressor()
    opt = torch.optim.RMSprop(net.parameters(), lr=2e-3)
    monitor_obj = None
    if monitor is not None:
        import optcheck

        monitor_obj = optcheck.Monitor(net, opt, **monitor)  # optcheck
    ckpt = None
    history, val_history = [], []
    for step in range(steps):
        i = torch.randint(0, 896, (64,))
        opt.zero_grad()
        pred = net(X[i])
        loss = F.mse_loss(pred, Y[i])
        if bug == "loss-from-item":
            loss = torch.tensor(loss.item(), requires_grad=True)  # "to make backward() work"
        loss.backward()
        opt.step()
        if monitor_obj is not None:
            monitor_obj.step(loss)  # optcheck
        history.append(loss.item())
        if step % 5 == 0:
            val_history.append(F.mse_loss(net(Xv), Yv).item())  # forward only, no no_grad
        if step == 20:
            buf = io.BytesIO()
            torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, buf)
            ckpt = buf.getvalue()
        if step == 30:
            state = torch.load(io.BytesIO(ckpt))
            if bug == "load-assign":
                net.load_state_dict(state["model"], assign=True)
            else:
                net.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
    if monitor_obj is not None:
        monitor_obj.close()  # optcheck
    return history, monitor_obj


# --------------------------------------------------------------------------- 7. contrastive, two views
class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 32))
        self.proj = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x):
        return F.normalize(self.proj(self.net(x)), dim=1)


def train_contrastive(bug=None, monitor=None, steps=40, seed=0):
    """SimCLR-style: two augmented views through the same BatchNorm encoder in one step,
    InfoNCE loss, SGD, cosine schedule; ``every=1`` is a good test of this one."""
    torch.manual_seed(seed)
    base = torch.randn(512, 16)
    enc = Encoder()
    opt = torch.optim.SGD(enc.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    losses = []
    with _monitor(enc, opt, monitor) as mon:
        for _ in range(steps):
            x = base[torch.randint(0, 512, (64,))]
            v1 = x + 0.1 * torch.randn_like(x)
            v2 = x * (1 + 0.1 * torch.randn_like(x))
            z1, z2 = enc(v1), enc(v2)
            logits = z1 @ z2.t() / 0.2
            loss = F.cross_entropy(logits, torch.arange(64))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
    return losses, mon


# --------------------------------------------------------------------------- 8. DCGAN-style GAN
def train_gan(bug=None, monitor=None, steps=40, seed=0, watch="D"):
    """The PyTorch DCGAN tutorial's update order on 2-D points: ``netD.zero_grad()``,
    D on real and ``fake.detach()``, ``optimizerD.step()``; ``netG.zero_grad()``, G
    through D, ``optimizerG.step()``. The monitor watches D (or G)."""
    torch.manual_seed(seed)
    netG = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    netD = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    crit = nn.BCEWithLogitsLoss()
    losses = []
    watched = (netD, optD) if watch == "D" else (netG, optG)
    with _monitor(*watched, monitor) as mon:
        for _ in range(steps):
            real = torch.randn(64, 2) * 0.5 + torch.tensor([2.0, -1.0])
            netD.zero_grad()
            errD_real = crit(netD(real), torch.ones(64, 1))
            errD_real.backward()
            fake = netG(torch.randn(64, 4))
            errD_fake = crit(netD(fake.detach()), torch.zeros(64, 1))
            errD_fake.backward()
            if bug == "d-step-before-g-backward":  # both losses first, then the two updates
                errG = crit(netD(fake), torch.ones(64, 1))
                optD.step()  # writes D's weights, which errG's graph saved
                netG.zero_grad()
                errG.backward()
            else:
                optD.step()
                netG.zero_grad()
                errG = crit(netD(fake), torch.ones(64, 1))
                errG.backward()
            optG.step()
            losses.append((errD_real + errD_fake).item())
    return losses, mon


# --------------------------------------------------------------------------- 9. a loss history that leaks
class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                    nn.Linear(256, 10))

    def forward(self, x):
        return self.layers(x)


def train_leaky(bug=None, monitor=None, steps=100, seed=0):
    """Plain Adam loop keeping a running list of losses for logging; ``bug="leak"``
    appends the loss tensor itself (with its graph: ~0.9 MB of saved activations a step)."""
    torch.manual_seed(seed)
    model = Wide()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for _ in range(steps):
            x = torch.randn(256, 64)
            y = (x[:, :10].argmax(1))
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss if bug == "leak" else loss.item())
    return [float(v) for v in losses], mon


# --------------------------------------------------------------------------- 10. matrix factorisation, sparse grads
class MF(nn.Module):
    def __init__(self, users=200, items=300, k=16):
        super().__init__()
        self.user = nn.Embedding(users, k, sparse=True)
        self.item = nn.Embedding(items, k, sparse=True)
        self.user_bias = nn.Embedding(users, 1, sparse=True)
        self.item_bias = nn.Embedding(items, 1, sparse=True)

    def forward(self, u, i):
        dot = (self.user(u) * self.item(i)).sum(-1)
        return dot + self.user_bias(u).squeeze(-1) + self.item_bias(i).squeeze(-1)


def train_recsys(bug=None, monitor=None, steps=40, seed=0):
    """Implicit ratings, sparse embeddings, ``SparseAdam``."""
    torch.manual_seed(seed)
    U, V = torch.randn(200, 4), torch.randn(300, 4)
    model = MF()
    opt = torch.optim.SparseAdam(list(model.parameters()), lr=1e-2)
    losses = []
    with _monitor(model, opt, monitor) as mon:
        for _ in range(steps):
            u, i = torch.randint(0, 200, (128,)), torch.randint(0, 300, (128,))
            r = (U[u] * V[i]).sum(-1)
            loss = F.mse_loss(model(u, i), r)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, mon


#: loop name -> function
LOOPS = {"mlp": train_mlp, "cnn": train_cnn, "lstm": train_lstm, "gpt": train_gpt, "frozen": train_frozen,
         "regression": train_regression, "contrastive": train_contrastive, "gan": train_gan, "leaky": train_leaky,
         "recsys": train_recsys}
