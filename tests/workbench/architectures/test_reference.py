"""Exact recovery against independent implementations: PyTorch and Hugging Face.

Each recovered model (`encoder_from_torch`, `bert_from_hf`, `gpt2_from_hf`, `vit_from_hf`,
Paper A's literal scheme) is run on the same weights and inputs as the reference, and the largest
absolute difference must be at most 1e-4 in float32 and 1e-10 in float64 (the reference then
runs in float64 too). The direct NumPy forwards `direct_vit` and `direct_cvt` (the
exact-recovery study's second oracle) are checked against the same models in float64. Sizes are
small (d <= 64, at most 4 layers, at most 16 tokens) so the module runs in about a minute on two
CPU cores; nearly all of it is compiling one model per case.

Note on float64 references: a torch module must be cast with `.double()` *before*
`load_state_dict`, which copies into the existing parameters; loading float64 weights into
float32 parameters rounds them to float32 and leaves errors of ~1e-7.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import require_reference  # noqa: E402

torch, transformers = require_reference()

import workbench as wb  # noqa: E402

pytestmark = [pytest.mark.reference, pytest.mark.slow]

A = wb.architectures
DTYPES = (np.float32, np.float64)
TOL = {np.float32: 1e-4, np.float64: 1e-10}
TORCH_DTYPE = {np.float32: torch.float32, np.float64: torch.float64}


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _load(model, state_dict, dtype):
    """Cast `model` to `dtype`, then load the numpy `state_dict`; every parameter must be set."""
    model = model.to(TORCH_DTYPE[dtype]).eval()
    result = model.load_state_dict(
        {k: torch.tensor(np.asarray(v, dtype)) for k, v in state_dict.items()}, strict=False
    )
    params = dict(model.named_parameters())
    assert not result.unexpected_keys, result.unexpected_keys
    assert not [k for k in result.missing_keys if k in params], result.missing_keys
    return model


def _assert_close(got, want, dtype, label):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == np.dtype(dtype), f"{label}: output dtype {got.dtype}, expected {dtype}"
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    print(f"[reference] {label} {np.dtype(dtype).name}: max abs error {err:.3e}")
    assert err <= TOL[dtype], f"{label}: max abs error {err:.3e} > {TOL[dtype]:.0e}"


def _torch_encoder(
    *, d, heads, ff, layers, norm_first, activation, final_norm, eps=1e-5, batch_first=True
):
    layer = torch.nn.TransformerEncoderLayer(
        d,
        heads,
        ff,
        dropout=0.0,
        batch_first=batch_first,
        norm_first=norm_first,
        activation=activation,
        layer_norm_eps=eps,
    )
    norm = torch.nn.LayerNorm(d, eps=eps) if final_norm else None
    return torch.nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=False)


# Compiling each model once as a whole keeps the module fast; the eager (unjitted) call path is
# exercised by the Paper A, rediscretization and GPT-2 batch tests.
@eqx.filter_jit
def _apply(model, *args):
    return model(*args)


@eqx.filter_jit
def _apply_batch(model, *args):
    return jax.vmap(model)(*args)


@eqx.filter_jit
def _apply_masked_batch(model, u, keep):
    return jax.vmap(lambda x, k: model(x, mask=k))(u, keep)


def _torch_run(model, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# 1. torch.nn.TransformerEncoder
# --------------------------------------------------------------------------------------------

# (norm_first, activation) -> configurations (d, heads, dim_feedforward, layers, n, final_norm)
ENCODER_CASES = {
    (False, "relu"): [
        (12, 3, 20, 2, 7, True),
        (20, 4, 37, 3, 11, False),
        (64, 8, 128, 1, 16, True),
    ],
    (False, "gelu"): [(36, 6, 50, 2, 9, False), (16, 2, 64, 4, 5, True), (20, 5, 24, 1, 13, False)],
    (True, "relu"): [(20, 2, 48, 3, 8, True), (36, 4, 36, 2, 16, False), (12, 6, 31, 4, 3, True)],
    (True, "gelu"): [(12, 2, 40, 2, 10, False), (48, 8, 96, 3, 7, True), (36, 9, 20, 1, 12, False)],
}
ENCODER_PARAMS = [
    pytest.param(nf, act, cfg, id=f"{'pre' if nf else 'post'}-{act}-d{cfg[0]}-h{cfg[1]}")
    for (nf, act), cfgs in ENCODER_CASES.items()
    for cfg in cfgs
]


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize(("norm_first", "activation", "cfg"), ENCODER_PARAMS)
def test_encoder_matches_torch(norm_first, activation, cfg, dtype):
    """A batch of sequences through `jax.vmap(m)` equals `TransformerEncoder` on the batch."""
    d, heads, ff, layers, n, final_norm = cfg
    rng = np.random.default_rng(
        [d, heads, ff, layers, n, int(norm_first), int(activation == "gelu")]
    )
    sd = A.random_encoder_state_dict(
        rng, d=d, num_layers=layers, dim_feedforward=ff, final_norm=final_norm, dtype=dtype
    )
    u = rng.standard_normal((3, n, d)).astype(dtype)
    ref = _torch_encoder(
        d=d,
        heads=heads,
        ff=ff,
        layers=layers,
        norm_first=norm_first,
        activation=activation,
        final_norm=final_norm,
    )
    want = _torch_run(_load(ref, sd, dtype), torch.from_numpy(u)).numpy()
    m = A.encoder_from_torch(
        sd, num_heads=heads, norm_first=norm_first, activation=activation, layer_norm_eps=1e-5
    )
    label = f"encoder {'pre' if norm_first else 'post'}-LN/{activation} {cfg}"
    _assert_close(_apply_batch(m, jnp.asarray(u)), want, dtype, label)
    # Rediscretizing to another scheme and back to Lie–Trotter with one step per layer gives back
    # the network (same structure, so this reuses the compiled function).
    back = m.rediscretize(scheme=wb.schemes.Strang(), steps_per_layer=2).rediscretize(
        scheme=wb.schemes.LieTrotter(), steps_per_layer=1
    )
    _assert_close(_apply_batch(back, jnp.asarray(u)), want, dtype, label + " rediscretized")


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_encoder_docstring_snippet_in_both_layouts(batch_first):
    """The layouts `encoder_from_torch`'s docstring states, run as written, in float32:
    `m(u) == enc(x[None])[0]` with `batch_first=True` and `enc(x[:, None])[:, 0]` with torch's
    default `batch_first=False`, whose `enc(x[None])` is n sequences of length 1."""
    doc = A.encoder_from_torch.__doc__
    assert "enc(x[None])[0]        with batch_first=True" in doc
    assert "enc(x[:, None])[:, 0]  with batch_first=False (torch's default)" in doc
    d, H, ff, layers, n = 16, 4, 24, 2, 7
    rng = np.random.default_rng(500 + int(batch_first))
    sd0 = A.random_encoder_state_dict(
        rng, d=d, num_layers=layers, dim_feedforward=ff, final_norm=True, dtype=np.float32
    )
    enc = _torch_encoder(
        d=d,
        heads=H,
        ff=ff,
        layers=layers,
        norm_first=False,
        activation="relu",
        final_norm=True,
        batch_first=batch_first,
    )
    enc = _load(enc, sd0, np.float32)
    u = rng.standard_normal((n, d)).astype(np.float32)

    # -- the docstring's snippet --
    sd = {k: v.detach().numpy() for k, v in enc.state_dict().items()}
    m = A.encoder_from_torch(
        sd, num_heads=H, norm_first=False, activation="relu", layer_norm_eps=1e-5
    )
    x = torch.from_numpy(u)
    y = np.asarray(m(jnp.asarray(u)))
    with torch.no_grad():
        want = (enc(x[None])[0] if batch_first else enc(x[:, None])[:, 0]).numpy()
        wrong = (enc(x[:, None])[:, 0] if batch_first else enc(x[None])[0]).numpy()
    # -- end of the snippet --

    assert y.dtype == np.float32 and y.shape == (n, d)
    err = float(np.max(np.abs(y - want)))
    print(f"[reference] docstring snippet batch_first={batch_first}: max abs error {err:.3e}")
    assert err <= 1e-5
    # The other layout's expression is a different computation (n sequences of length 1, or one
    # sequence per batch entry): copying the wrong one would not match.
    assert float(np.max(np.abs(y - wrong))) > 1e-2


@pytest.mark.parametrize(
    ("norm_first", "dtype"), [(False, np.float32), (True, np.float64)], ids=["post-f32", "pre-f64"]
)
def test_encoder_key_padding_mask_matches_torch(norm_first, dtype):
    """`src_key_padding_mask` (True = pad) equals `m(u, mask=~pad)` on the real tokens."""
    d, heads, ff, layers, n = 20, 4, 40, 2, 9
    rng = np.random.default_rng(11 + int(norm_first))
    sd = A.random_encoder_state_dict(
        rng, d=d, num_layers=layers, dim_feedforward=ff, final_norm=True, dtype=dtype
    )
    u = rng.standard_normal((2, n, d)).astype(dtype)
    pad = np.zeros((2, n), bool)
    pad[0, 6:] = True  # trailing padding
    pad[1, [1, 4, 5]] = True  # scattered padding
    ref = _torch_encoder(
        d=d,
        heads=heads,
        ff=ff,
        layers=layers,
        norm_first=norm_first,
        activation="relu",
        final_norm=True,
    )
    ref = _load(ref, sd, dtype)
    want = _torch_run(ref, torch.from_numpy(u), src_key_padding_mask=torch.from_numpy(pad)).numpy()
    keep = ~pad
    # The case is sensitive: without the mask the real tokens' outputs change.
    unmasked = _torch_run(ref, torch.from_numpy(u)).numpy()
    assert np.max(np.abs(unmasked[keep] - want[keep])) > 1e-3
    m = A.encoder_from_torch(sd, num_heads=heads, norm_first=norm_first)
    got = np.asarray(_apply_masked_batch(m, jnp.asarray(u), jnp.asarray(keep)))
    # torch may zero the padded rows (fast path); only the real tokens are defined outputs.
    _assert_close(got[keep], want[keep], dtype, f"encoder {'pre' if norm_first else 'post'} mask")


# --------------------------------------------------------------------------------------------
# 2. Hugging Face BertModel
# --------------------------------------------------------------------------------------------

# (d, heads, layers, intermediate, n)
BERT_CASES = [(20, 4, 2, 37, 9), (32, 2, 3, 64, 16), (12, 3, 1, 48, 5)]


def _hf_bert(cfg, sd, dtype):
    model = transformers.BertModel(transformers.BertConfig(**cfg), add_pooling_layer=False)
    return _load(model, sd, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", BERT_CASES, ids=lambda c: f"d{c[0]}-h{c[1]}-L{c[2]}")
def test_bert_matches_hf(case, dtype):
    d, heads, layers, inter, n = case
    rng = np.random.default_rng([100, *case])
    cfg = A.bert_config(d=d, num_heads=heads, num_layers=layers, intermediate=inter)
    sd = A.random_bert_state_dict(rng, cfg, dtype=dtype)
    ids = rng.integers(0, cfg["vocab_size"], n)
    types = rng.integers(0, cfg["type_vocab_size"], n)
    out = _torch_run(
        _hf_bert(cfg, sd, dtype),
        input_ids=torch.from_numpy(ids)[None],
        token_type_ids=torch.from_numpy(types)[None],
    )
    want = out.last_hidden_state[0].numpy()
    b = A.bert_from_hf(sd, cfg)
    got = _apply(b, jnp.asarray(ids), jnp.asarray(types))
    _assert_close(got, want, dtype, "BERT")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_bert_attention_mask_matches_hf(dtype):
    """A padded batch (1 = token, 0 = pad) through `jax.vmap`; compared on the real tokens."""
    d, heads, layers, inter, n = 36, 6, 2, 50, 12
    rng = np.random.default_rng(7)
    cfg = A.bert_config(d=d, num_heads=heads, num_layers=layers, intermediate=inter)
    sd = A.random_bert_state_dict(rng, cfg, dtype=dtype)
    ids = rng.integers(0, cfg["vocab_size"], (2, n))
    types = rng.integers(0, cfg["type_vocab_size"], (2, n))
    mask = np.ones((2, n), np.int64)
    mask[0, 8:] = 0
    mask[1, 3:] = 0
    ref = _hf_bert(cfg, sd, dtype)
    inputs = {"input_ids": torch.from_numpy(ids), "token_type_ids": torch.from_numpy(types)}
    want = _torch_run(ref, **inputs, attention_mask=torch.from_numpy(mask)).last_hidden_state
    want = want.numpy()
    keep = mask.astype(bool)
    unmasked = _torch_run(ref, **inputs).last_hidden_state.numpy()
    assert np.max(np.abs(unmasked[keep] - want[keep])) > 1e-3
    b = A.bert_from_hf(sd, cfg)
    got = np.asarray(_apply_batch(b, jnp.asarray(ids), jnp.asarray(types), jnp.asarray(mask)))
    _assert_close(got[keep], want[keep], dtype, "BERT attention_mask")


# --------------------------------------------------------------------------------------------
# 3. Hugging Face GPT2Model
# --------------------------------------------------------------------------------------------

# (d, heads, layers, n_inner, n)
GPT2_CASES = [(20, 4, 2, None, 9), (36, 6, 3, 50, 16), (12, 3, 4, 7, 6)]


def _hf_gpt2(cfg, sd, dtype):
    # bos/eos ids only silence a vocabulary-range warning; they do not enter the forward pass.
    config = transformers.GPT2Config(**cfg, bos_token_id=0, eos_token_id=0)
    return _load(transformers.GPT2Model(config), sd, dtype)


def _gpt2_case(case, dtype):
    d, heads, layers, inner, n = case
    rng = np.random.default_rng([200, d, heads, layers, inner or 0, n])
    cfg = A.gpt2_config(d=d, num_heads=heads, num_layers=layers, inner=inner)
    sd = A.random_gpt2_state_dict(rng, cfg, dtype=dtype)
    ids = rng.integers(0, cfg["vocab_size"], n)
    return cfg, sd, ids


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", GPT2_CASES, ids=lambda c: f"d{c[0]}-h{c[1]}-L{c[2]}-inner{c[3]}")
def test_gpt2_matches_hf(case, dtype):
    cfg, sd, ids = _gpt2_case(case, dtype)
    ref = _hf_gpt2(cfg, sd, dtype)
    want = _torch_run(ref, input_ids=torch.from_numpy(ids)[None]).last_hidden_state[0].numpy()
    g = A.gpt2_from_hf(sd, cfg)
    got = np.asarray(_apply(g, jnp.asarray(ids)))
    _assert_close(got, want, dtype, "GPT-2")
    # Causality against HF: HF on a prefix equals the first rows of the workbench output.
    for k in (1, len(ids) // 2):
        prefix = _torch_run(ref, input_ids=torch.from_numpy(ids[:k])[None]).last_hidden_state[0]
        _assert_close(got[:k], prefix.numpy(), dtype, f"GPT-2 prefix {k}")
    same = g.rediscretize(scheme=wb.schemes.LieTrotter(), steps_per_layer=1)
    _assert_close(_apply(same, jnp.asarray(ids)), want, dtype, "GPT-2 rediscretized")


@pytest.mark.parametrize("dtype", [np.float64], ids=["float64"])
def test_gpt2_batch_vmap_matches_hf(dtype):
    cfg, sd, _ = _gpt2_case(GPT2_CASES[0], dtype)
    ids = np.random.default_rng(5).integers(0, cfg["vocab_size"], (3, 10))
    want = _torch_run(_hf_gpt2(cfg, sd, dtype), input_ids=torch.from_numpy(ids)).last_hidden_state
    # The eager `jax.vmap` path (no jit) of the public contract.
    got = jax.vmap(A.gpt2_from_hf(sd, cfg))(jnp.asarray(ids))
    _assert_close(got, want.numpy(), dtype, "GPT-2 batch")


# --------------------------------------------------------------------------------------------
# 3b. Hugging Face ViTModel
# --------------------------------------------------------------------------------------------

# (d, heads, layers, intermediate, image (rows, cols), patch (rows, cols), channels, qkv_bias)
VIT_CASES = [
    (16, 2, 2, 32, (8, 8), (4, 4), 3, True),  # square image and patches, 2×2 grid
    (12, 3, 2, 24, (12, 8), (4, 4), 1, True),  # non-square image: 3×2 grid, one channel
    (20, 4, 1, 40, (9, 12), (3, 4), 3, False),  # non-square patches: 3×3 grid, no q/k/v bias
]


def _vit_case(case, dtype):
    d, heads, layers, inter, image, patch, channels, qkv_bias = case
    rng = np.random.default_rng([300, d, heads, layers, *image, *patch])
    cfg = A.vit_config(
        d=d,
        num_heads=heads,
        num_layers=layers,
        intermediate=inter,
        image_size=image,
        patch_size=patch,
        num_channels=channels,
        qkv_bias=qkv_bias,
    )
    sd = A.random_vit_state_dict(rng, cfg, dtype=dtype)
    pixels = rng.standard_normal((2, channels, *image)).astype(dtype)
    return cfg, sd, pixels


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", VIT_CASES, ids=lambda c: f"d{c[0]}-img{c[4]}-patch{c[5]}")
def test_vit_matches_hf(case, dtype):
    """`vit_from_hf(...)(image)` equals `ViTModel(pixel_values).last_hidden_state[0]`, for two
    images through `jax.vmap`."""
    cfg, sd, pixels = _vit_case(case, dtype)
    ref = _load(
        transformers.ViTModel(transformers.ViTConfig(**cfg), add_pooling_layer=False), sd, dtype
    )
    want = _torch_run(ref, pixel_values=torch.from_numpy(pixels)).last_hidden_state.numpy()
    v = A.vit_from_hf(sd, cfg)
    got = np.asarray(_apply_batch(v, jnp.asarray(pixels)))
    _assert_close(got, want, dtype, f"ViT {cfg['image_size']} / {cfg['patch_size']}")


def test_direct_vit_matches_hf():
    """The direct NumPy `direct_vit` (the study's second oracle) equals `ViTModel` in float64."""
    for case in VIT_CASES:
        cfg, sd, pixels = _vit_case(case, np.float64)
        ref = A.hf_vit(sd, cfg, dtype=np.float64)
        want = _torch_run(ref, pixel_values=torch.from_numpy(pixels)).last_hidden_state.numpy()
        got = np.stack([A.direct_vit(sd, cfg, x) for x in pixels])
        _assert_close(got, want, np.float64, f"direct ViT {cfg['image_size']}")


def test_vit_classifier_is_vit_for_image_classification_and_exports_to_it(rng):
    """`wbc.vit_classifier(vit_from_hf(...))` with the classifier's weights gives
    `ViTForImageClassification`'s logits (float64, 1e-10); `vit_to_hf` inverts `vit_from_hf`
    exactly, and the `vit.`-prefixed state dict of the classification model loads."""
    import workbench.control as wbc

    cfg, sd, pixels = _vit_case(VIT_CASES[1], np.float64)
    ref = _load(
        transformers.ViTForImageClassification(transformers.ViTConfig(**cfg, num_labels=5)),
        {
            **{"vit." + k: v for k, v in sd.items()},
            "classifier.weight": rng.standard_normal((5, cfg["hidden_size"])),
            "classifier.bias": rng.standard_normal(5),
        },
        np.float64,
    )
    full = {k: v.numpy() for k, v in ref.state_dict().items()}
    want = _torch_run(ref, pixel_values=torch.from_numpy(pixels)).logits.numpy()
    model = wbc.vit_classifier(A.vit_from_hf(full, cfg), 5)
    model = eqx.tree_at(
        lambda m: (m.head.weight, m.head.bias),
        model,
        (jnp.asarray(full["classifier.weight"].T), jnp.asarray(full["classifier.bias"])),
    )
    _assert_close(_apply_batch(model, jnp.asarray(pixels)), want, np.float64, "ViT classifier")
    back, back_cfg = A.vit_to_hf(A.vit_from_hf(sd, cfg))
    assert sorted(back) == sorted(sd) and all(np.array_equal(back[k], sd[k]) for k in sd)
    assert {k: back_cfg[k] for k in cfg} == cfg
    with pytest.raises(ValueError, match="Lie-Trotter with one step per layer"):
        A.vit_to_hf(A.vit_from_hf(sd, cfg).rediscretize(steps_per_layer=2))


# --------------------------------------------------------------------------------------------
# 3c. Hugging Face CvtModel
# --------------------------------------------------------------------------------------------

# (image (rows, cols), cvt_config arguments). Hugging Face's CvtStage indexes its drop-path
# rates by the stage number, so it needs depth[s] > s: the depths below respect that.
CVT_CASES = [
    ((32, 32), dict()),  # 2 stages, 8×8 → 4×4 grids, class token in the last
    (
        (40, 28),
        dict(
            embed_dim=(8, 12, 16),
            num_heads=(1, 2, 4),
            depth=(1, 2, 3),
            patch_sizes=(7, 3, 3),
            patch_stride=(4, 2, 2),
            patch_padding=(2, 1, 1),
            stride_kv=(1, 2, 2),
        ),
    ),  # 3 stages, non-square 10×7 → 5×4 → 3×2
    ((24, 36), dict(cls_token_last=False, qkv_bias=False, num_channels=1)),  # no class token
]


def _cvt_case(case, dtype):
    image, kw = case
    rng = np.random.default_rng([310, *image, len(kw)])
    cfg = A.cvt_config(**kw)
    sd = A.random_cvt_state_dict(rng, cfg, dtype=dtype)
    pixels = rng.standard_normal((2, cfg["num_channels"], *image)).astype(dtype)
    return cfg, sd, pixels


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", CVT_CASES, ids=lambda c: f"img{c[0][0]}x{c[0][1]}-{len(c[1])}")
def test_cvt_matches_hf(case, dtype):
    """`cvt_from_hf(...)(image)` equals `CvtModel(pixel_values)`: every stage's feature map
    (`hidden_states`), the last stage's tokens and the class token, for two images through
    `jax.vmap`, with non-trivial BatchNorm running statistics."""
    cfg, sd, pixels = _cvt_case(case, dtype)
    ref = A.hf_cvt(sd, cfg, dtype=dtype)
    out = _torch_run(ref, pixel_values=torch.from_numpy(pixels), output_hidden_states=True)
    m = A.cvt_from_hf(sd, cfg, image_size=pixels.shape[2:])
    # The model is an argument, not closed over (equinox warns on a jitted `jax.vmap` of a bound
    # method: its arrays would be baked into the program as constants).
    maps = eqx.filter_jit(lambda m, x: jax.vmap(m.feature_maps)(x))(m, jnp.asarray(pixels))
    for s, ((x, _), want) in enumerate(zip(maps, out.hidden_states, strict=True)):
        _assert_close(x, want.numpy(), dtype, f"CvT {m.grids} stage {s}")
    tokens, cls = _apply_batch(m, jnp.asarray(pixels))
    last = out.last_hidden_state.numpy()
    _assert_close(tokens, last.reshape(*last.shape[:2], -1).transpose(0, 2, 1), dtype, "CvT tokens")
    if cfg["cls_token"][-1]:
        _assert_close(cls, out.cls_token_value.numpy()[:, 0], dtype, "CvT class token")
    else:
        assert cls is None and out.cls_token_value is None


def test_direct_cvt_matches_hf():
    """The direct NumPy `direct_cvt` (the study's second oracle) equals `CvtModel` in float64:
    the last stage's tokens and the class token (or its absence)."""
    for case in CVT_CASES:
        cfg, sd, pixels = _cvt_case(case, np.float64)
        out = _torch_run(A.hf_cvt(sd, cfg, dtype=np.float64), pixel_values=torch.from_numpy(pixels))
        last = out.last_hidden_state.numpy()
        for b, x in enumerate(pixels):
            tokens, cls = A.direct_cvt(sd, cfg, x)
            label = f"direct CvT {case[0]} image {b}"
            _assert_close(tokens, last[b].reshape(last.shape[1], -1).T, np.float64, label)
            if cfg["cls_token"][-1]:
                _assert_close(cls, out.cls_token_value.numpy()[b, 0], np.float64, label + " cls")
            else:
                assert cls is None and out.cls_token_value is None


# --------------------------------------------------------------------------------------------
# 4. Paper A's literal scheme
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [(12, 3, 2, 8), (20, 4, 3, 13)], ids=["d12-h3-L2", "d20-h4-L3"])
def test_paper_a_literal_matches_post_ln_and_torch(cfg):
    """Paper A's literal scheme = its post-LN equivalent (1e-12) = torch post-LN/ReLU, eps = 0."""
    d, heads, layers, n = cfg
    rng = np.random.default_rng([300, *cfg])
    p = A.PaperAEncoder.random(rng, d=d, num_heads=heads, num_layers=layers, eps=0.0)
    assert p.kernels.weight.shape == (layers, 2, d, d)
    u = rng.standard_normal((n, d))
    got = np.asarray(p(jnp.asarray(u)))
    equivalent = np.asarray(p.post_ln_equivalent()(jnp.asarray(u)))
    err = float(np.max(np.abs(got - equivalent)))
    print(f"[reference] Paper A literal vs post_ln_equivalent float64: max abs error {err:.3e}")
    assert err <= 1e-12

    sd = p.post_ln_state_dict()
    ref = _torch_encoder(
        d=d,
        heads=heads,
        ff=d,
        layers=layers,
        norm_first=False,
        activation="relu",
        final_norm=False,
        eps=0.0,
    )
    want = _torch_run(_load(ref, sd, np.float64), torch.from_numpy(u)[None])[0].numpy()
    _assert_close(got, want, np.float64, "Paper A literal vs torch")


# --------------------------------------------------------------------------------------------
# 5. Rediscretization keeps the network when it asks for the network's own scheme
# --------------------------------------------------------------------------------------------


def _rediscretize_case(norm_first, dtype):
    d, heads, ff, layers, n = 36, 6, 50, 3, 10
    rng = np.random.default_rng(400 + int(norm_first))
    sd = A.random_encoder_state_dict(
        rng, d=d, num_layers=layers, dim_feedforward=ff, final_norm=norm_first, dtype=dtype
    )
    u = rng.standard_normal((n, d)).astype(dtype)
    ref = _torch_encoder(
        d=d,
        heads=heads,
        ff=ff,
        layers=layers,
        norm_first=norm_first,
        activation="gelu",
        final_norm=norm_first,
    )
    want = _torch_run(_load(ref, sd, dtype), torch.from_numpy(u)[None])[0].numpy()
    m = A.encoder_from_torch(sd, num_heads=heads, norm_first=norm_first, activation="gelu")
    return m, jnp.asarray(u), want


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
@pytest.mark.parametrize(
    ("norm_first", "dtype"), [(False, np.float64), (True, np.float32)], ids=["post-f64", "pre-f32"]
)
def test_rediscretize_lie_trotter_one_step_matches_torch(norm_first, dtype):
    """`rediscretize(LieTrotter(), 1)(u)` (eager, one sequence) equals torch, also after a detour
    through Strang with 3 steps per layer."""
    m, u, want = _rediscretize_case(norm_first, dtype)
    lie = wb.schemes.LieTrotter()
    got = m.rediscretize(scheme=lie, steps_per_layer=1)(u)
    _assert_close(got, want, dtype, f"rediscretize {'pre' if norm_first else 'post'}")
    detour = m.rediscretize(scheme=wb.schemes.Strang(), steps_per_layer=3)
    back = detour.rediscretize(scheme=lie, steps_per_layer=1)(u)
    _assert_close(back, want, dtype, f"rediscretize round trip {'pre' if norm_first else 'post'}")


@pytest.mark.filterwarnings("ignore:rediscretize:UserWarning")  # post-norm + Strang, on purpose
@pytest.mark.parametrize(
    "dtype",
    [np.float32, np.float64],
    ids=["float32", "float64"],
)
def test_strang_rediscretization_differs_from_torch(dtype):
    """The check above is sensitive: another discretization of the same equation differs."""
    m, u, want = _rediscretize_case(False, dtype)
    got = m.rediscretize(scheme=wb.schemes.Strang(), steps_per_layer=3)(u)
    assert got.dtype == np.dtype(dtype)
    assert np.max(np.abs(np.asarray(got) - want)) > 1e-3
