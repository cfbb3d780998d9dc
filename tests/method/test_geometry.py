"""Each geometry metric against a naive implementation on small inputs, and the identity/exact cases."""
import itertools
import json
import math
import os

import pytest
import torch

from eval_geometry import flat_scalars
from lgpt.method import geometry as geo


def naive_pairs(X):
    return [(i, j) for i, j in itertools.combinations(range(len(X)), 2)]


def cos(a, b):
    return (a @ b / (a.norm() * b.norm())).item()


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(30, 8, generator=g, dtype=torch.float64)
    Y = X @ torch.randn(8, 6, generator=g, dtype=torch.float64) + 0.1 * torch.randn(30, 6, generator=g,
                                                                                        dtype=torch.float64)
    return X, Y


def test_angular_error_matches_naive(data):
    X, Y = data
    naive = sum(abs(math.acos(cos(X[i], X[j])) - math.acos(cos(Y[i], Y[j]))) for i, j in naive_pairs(X))
    naive /= len(naive_pairs(X))
    assert geo.angular_error(X, Y, chunk=7) == pytest.approx(naive, rel=1e-9)


def test_concordance_matches_naive_pearson_and_spearman(data):
    X, Y = data
    a = torch.tensor([cos(X[i], X[j]) for i, j in naive_pairs(X)], dtype=torch.float64)
    b = torch.tensor([cos(Y[i], Y[j]) for i, j in naive_pairs(X)], dtype=torch.float64)
    hc = geo.hyperspherical_concordance(X, Y, chunk=4)
    assert hc["pearson"] == pytest.approx(torch.corrcoef(torch.stack([a, b]))[0, 1].item(), rel=1e-9)
    ra, rb = a.argsort().argsort().double(), b.argsort().argsort().double()  # no ties in continuous data
    assert hc["spearman"] == pytest.approx(torch.corrcoef(torch.stack([ra, rb]))[0, 1].item(), rel=1e-9)


def test_ranks_average_ties():
    assert geo._ranks(torch.tensor([3.0, 1.0, 3.0, 2.0])).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_identity_and_orthogonal_maps_keep_geometry(data):
    X, _ = data
    Q = torch.linalg.qr(torch.randn(8, 8, dtype=torch.float64))[0]
    for Y in (X, X @ Q.T):
        assert geo.angular_error(X, Y) < 1e-6
        assert geo.hyperspherical_concordance(X, Y)["pearson"] == pytest.approx(1.0, abs=1e-9)
    eye = torch.eye(8, dtype=torch.float64)
    assert geo.feature_alignment(X, eye, eye) == pytest.approx(1.0)
    assert geo.jl_distortion(X, Q)["max"] < 1e-9


def test_feature_alignment_matches_naive(data):
    X, _ = data
    T = torch.randn(5, 8, dtype=torch.float64)
    P = torch.linalg.pinv(T)
    naive = sum(cos(w, P @ T @ w) for w in X) / len(X)
    assert geo.feature_alignment(X, T, P) == pytest.approx(naive, rel=1e-9)


def test_kurtosis_and_rtn_match_naive():
    x = torch.tensor([1.0, 2.0, 3.0, 10.0], dtype=torch.float64)
    mu = x.mean()
    m2, m4 = ((x - mu) ** 2).mean(), ((x - mu) ** 4).mean()
    assert geo.excess_kurtosis(x) == pytest.approx((m4 / m2**2 - 3).item())
    assert abs(geo.excess_kurtosis(torch.randn(200_000, dtype=torch.float64))) < 0.05
    W = torch.tensor([[0.5, -1.0, 0.26], [2.0, 0.1, -0.3]], dtype=torch.float64)
    Q = torch.empty_like(W)
    for r in range(2):
        scale = W[r].abs().max() / 127
        Q[r] = torch.round(W[r] / scale) * scale
    assert torch.allclose(geo.rtn_quantize(W, 8), Q)
    assert geo.rtn_error(W, 4) > geo.rtn_error(W, 8) > 0


def test_jl_distortion_matches_naive_and_the_bound_inverts_the_width(data):
    X, _ = data
    T = torch.randn(4, 8, dtype=torch.float64) / 2
    eps = [abs((T @ (X[i] - X[j])).pow(2).sum() / (X[i] - X[j]).pow(2).sum() - 1).item() for i, j in naive_pairs(X)]
    assert geo.jl_distortion(X, T)["max"] == pytest.approx(max(eps), rel=1e-9)
    from lgpt.method.maps import jl_min_width
    e = geo.jl_epsilon_bound(1000, 800, 0.05)
    assert jl_min_width(1000, e + 1e-6, 0.05) <= 800 < jl_min_width(1000, e - 1e-3, 0.05)
    assert geo.jl_epsilon_bound(10**6, 5) is None


def test_intrinsic_dimension():
    g = torch.Generator().manual_seed(0)
    basis = torch.randn(3, 20, generator=g, dtype=torch.float64)
    H = torch.randn(500, 3, generator=g, dtype=torch.float64) @ basis
    assert geo.intrinsic_dimension(H) <= 3
    assert geo.intrinsic_dimension(torch.randn(2000, 20, generator=g)) > 15


def test_reader_alignment_matches_naive_and_measures_something_where_fa_is_one():
    g = torch.Generator().manual_seed(0)
    W = torch.randn(6, 4, generator=g, dtype=torch.float64)
    T = torch.randn(7, 4, generator=g, dtype=torch.float64)  # m ≥ d: FA ≡ 1 for any full-rank T
    P = torch.linalg.pinv(T)
    assert geo.feature_alignment(W, T, P) == pytest.approx(1.0)
    W_new = W @ P  # the residual rule's readers
    naive = sum(torch.nn.functional.cosine_similarity(W_new[k], T @ W[k], dim=0).item() for k in range(6)) / 6
    assert geo.reader_alignment(W, W_new, T) == pytest.approx(naive)
    assert geo.reader_alignment(W, W_new, T) < 0.99  # Gaussian T: (T⁺)ᵀw ≠ T·w
    Q = torch.linalg.qr(T)[0]
    assert geo.reader_alignment(W, W @ Q.T, Q) == pytest.approx(1.0)  # orthonormal columns: T⁺ = Tᵀ


def test_ndcg_matches_naive_and_is_one_for_the_ideal_ranking():
    rel = torch.tensor([[0.5, 0.3, 0.1, 0.1]], dtype=torch.float64)
    scores = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    order = [3, 2, 1]
    gain = [2 ** r - 1 for r in rel[0].tolist()]  # thesis eq. 5.7: gain 2^rel − 1
    dcg = sum(gain[t] / math.log2(r + 2) for r, t in enumerate(order))
    ideal = gain[0] / math.log2(2) + gain[1] / math.log2(3) + gain[2] / math.log2(4)
    assert geo.ndcg_at_k(scores, rel, 3) == pytest.approx(dcg / ideal)
    assert geo.ndcg_at_k(rel, rel, 3) == pytest.approx(1.0)


def test_similarity_scores_match_naive():
    h, E = torch.randn(3, 5), torch.randn(7, 5)
    d = torch.stack([torch.stack([(hi - e).norm() for e in E]) for hi in h]).double()
    assert torch.allclose(geo.similarity_scores(h, E, "neg_euclidean"), -d, atol=1e-5)
    assert torch.allclose(geo.similarity_scores(h, E, "inv_euclidean"), 1 / d, atol=1e-4)
    assert torch.allclose(geo.similarity_scores(h, E, "dot"), (h @ E.T).double(), atol=1e-5)


def test_kl_and_agreement():
    logits = torch.randn(2, 5, 11)
    assert geo.kl_and_agreement(logits, logits) == {"kl": pytest.approx(0.0, abs=1e-12), "top1_agreement": 1.0}
    other = logits.clone()
    other[..., 0] += 100
    p = logits.double().softmax(-1)
    naive = (p * (p.log() - other.double().log_softmax(-1))).sum(-1).mean().item()
    assert geo.kl_and_agreement(logits, other)["kl"] == pytest.approx(naive, rel=1e-9)


# ---------------------------------------------------------------------------------------------- the CLI


def run_eval(*args):
    from eval_geometry import GeometryConfig, evaluate_geometry
    from lgpt.plumbing.configurator import load_config
    return evaluate_geometry(load_config(GeometryConfig, ["--n_probes=600", "--eval_iters=3", "--probe_batches=2",
                                                 "--wandb_log=False", *args]))


@pytest.mark.slow
def test_orthogonal_same_width_keeps_geometry_end_to_end(trained_dir, char_data_dir, tmp_path):
    from transform import TransformConfig, transform_checkpoint
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=32, kind="orthogonal",
                        data_dir=char_data_dir, eval_iters=0))
    m = run_eval(f"--ref_dir={trained_dir}", f"--in_dir={tmp_path / 't'}", f"--out_dir={tmp_path / 'g'}",
                 f"--data_dir={char_data_dir}")
    assert m["reference_centred"] is True  # LayerNorm model, folded
    for flavour in ("map", "model"):
        assert m["angular_error"][flavour] < 1e-4
        assert m["concordance"][flavour]["pearson"] == pytest.approx(1.0, abs=1e-6)
    assert m["kl"] < 1e-8 and m["top1_agreement"] == 1.0
    assert m["feature_alignment"]["frequent_tokens"] == pytest.approx(1.0, abs=1e-6)
    assert m["feature_alignment"]["readers"] == pytest.approx(1.0, abs=1e-6)  # readers W·Tᵀ = images T·w
    circuits = m["circuits"]["mean"]  # an exact port keeps every head's circuits
    assert circuits["qk_spectrum_distance"] < 1e-4 and circuits["ov_spectrum_distance"] < 1e-4
    assert circuits["qk_token_overlap"] == 1.0 and circuits["ov_token_overlap"] == 1.0
    saved = json.load(open(tmp_path / "g" / "metrics.json"))
    assert saved["loss"]["new"]["val_loss"] == pytest.approx(saved["loss"]["ref"]["val_loss"], abs=1e-5)
    for name in saved["figures"].values():
        assert os.path.getsize(tmp_path / "g" / name) > 10_000
    bare = run_eval(f"--ref_dir={trained_dir}", f"--in_dir={tmp_path / 't'}", f"--out_dir={tmp_path / 'bare'}",
                    f"--data_dir={char_data_dir}", "--figures=False")  # a sweep's run: the same numbers, no PNG
    assert bare["figures"] == {} and not [f for f in os.listdir(tmp_path / "bare") if f.endswith(".png")]
    def measured(metrics: dict) -> dict:  # every number but the clock's
        return {k: v for k, v in flat_scalars(metrics).items() if not k.startswith("config/") and "throughput" not in k}
    assert measured(bare) == measured(m) and len(measured(m)) > 50


@pytest.mark.slow
def test_identity_compare_and_single_model(trained_dir, char_data_dir, tmp_path):
    m = run_eval(f"--ref_dir={trained_dir}", f"--in_dir={trained_dir}", f"--out_dir={tmp_path / 'g'}",
                 f"--data_dir={char_data_dir}")
    assert m["angular_error"]["model"] == pytest.approx(0.0, abs=1e-9)
    assert m["concordance"]["model"]["pearson"] == pytest.approx(1.0)
    assert m["kl"] == pytest.approx(0.0, abs=1e-12)
    single = run_eval(f"--ref_dir={trained_dir}", f"--out_dir={tmp_path / 's'}", f"--data_dir={char_data_dir}")
    assert "new" not in single["loss"] and single["angular_error"] == {}
    assert len(single["models"]["ref"]["intrinsic_dimension"]) == 3


@pytest.mark.slow
def test_shrink_loses_geometry_and_wandb_logs_offline(trained_dir, char_data_dir, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    from transform import TransformConfig, transform_checkpoint
    transform_checkpoint(TransformConfig(in_dir=trained_dir, out_dir=str(tmp_path / "t"), width=16, kind="gaussian",
                        data_dir=char_data_dir, eval_iters=0))
    m = run_eval(f"--ref_dir={trained_dir}", f"--in_dir={tmp_path / 't'}", f"--out_dir={tmp_path / 'g'}",
                 f"--data_dir={char_data_dir}", "--wandb_log=True")
    assert m["angular_error"]["map"] > 0.01 and m["concordance"]["map"]["pearson"] < 0.999
    assert 0 < m["feature_alignment"]["principal_directions"] < 1
    assert 0 < m["feature_alignment"]["readers"] < 0.99
    circuits = m["circuits"]["mean"]  # a Gaussian shrink to half width does not
    assert circuits["qk_spectrum_distance"] > 0.01 and circuits["ov_token_overlap"] < 1.0
    assert m["jl"]["empirical_eps"]["max"] > 0
    import glob
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*"))


@pytest.mark.parametrize("dim", [3, 6])
def test_twonn_recovers_the_dimension_of_a_curved_manifold_within_ten_percent(dim):
    """Uniform points on a dim-dimensional patch, bent by a smooth map and embedded in 40 dimensions."""
    g = torch.Generator().manual_seed(dim)
    u = torch.rand(3000, dim, generator=g, dtype=torch.float64)
    bent = torch.cat([u, torch.sin(3 * u), u.pow(2)], dim=1)  # a smooth embedding of the patch
    Q, _ = torch.linalg.qr(torch.randn(40, 3 * dim, generator=g, dtype=torch.float64))
    X = bent @ Q.T
    estimate = geo.twonn_dimension(X)
    assert abs(estimate - dim) < 0.1 * dim, estimate


def test_head_circuits_match_naive_and_are_invariant_under_an_orthogonal_port():
    g = torch.Generator().manual_seed(3)
    n, H, hd = 8, 2, 4
    c_attn, c_proj = torch.randn(3 * H * hd, n, generator=g), torch.randn(n, H * hd, generator=g)
    gain = torch.rand(n, generator=g) + 0.5
    (qk, ov), _ = geo.head_circuits(c_attn, c_proj, gain, H, hd)
    Wq, Wk, Wv = (c_attn[i * H * hd:i * H * hd + hd].double() * gain.double() for i in range(3))
    torch.testing.assert_close(qk, n * Wq.T @ Wk)
    torch.testing.assert_close(ov, math.sqrt(n) * c_proj[:, :hd].double() @ Wv)
    Q, _ = torch.linalg.qr(torch.randn(12, n, generator=g, dtype=torch.float64))  # orthonormal columns, m = 12
    E = torch.randn(20, n, generator=g, dtype=torch.float64)
    ported = geo.head_circuits(c_attn.double() * gain.double() @ Q.T * math.sqrt(n / 12), Q @ c_proj.double(), None,
                               H, hd)
    stable = geo.circuit_stability((qk, ov), ported[0], E, E @ Q.T, rank=hd)
    assert stable["qk_spectrum_distance"] < 1e-9 and stable["ov_spectrum_distance"] < 1e-9
    assert stable["qk_token_overlap"] == 1.0 and stable["ov_token_overlap"] == 1.0


def test_principal_directions_are_the_svds_right_singular_vectors():
    from lgpt.method import geometry as geo
    torch.manual_seed(0)
    states = [torch.randn(3, 50, 12) * torch.linspace(3, 0.1, 12) + 0.5 for _ in range(4)]
    stacked = torch.cat([h.reshape(-1, 12) for h in states]).double()
    _, _, Vh = torch.linalg.svd(stacked - stacked.mean(0), full_matrices=False)
    ours = geo.principal_directions(states, 5)
    torch.testing.assert_close((ours * Vh[:5]).sum(1).abs(), torch.ones(5, dtype=torch.float64), atol=1e-9, rtol=0)


def test_probe_ticks_name_each_layer_block_of_the_heatmap():
    from eval_geometry import probe_ticks
    ticks, labels, bounds = probe_ticks([-1, -1, 0, 0, 0, 1, 2, 2])
    assert labels == ["wte", "h0", "h1", "h2"]
    assert ticks == [0.5, 3.0, 5.0, 6.5] and bounds == [1.5, 4.5, 5.5]
