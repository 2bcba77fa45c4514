"""NVIDIA's support table as data (imgbuild/gpu/support.json): every row cites a source, malformed rows are one
line naming the row, and the table agrees with NVIDIA's own recorded strings (test_gpu_truth reads
NVIDIA_REQUIRE_CUDA for every recorded CUDA image against it)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from imgbuild.gpu import matrix
from imgbuild.gpu.fleet import judge_tag, parse_target
from imgbuild.gpu.support import SUPPORT, TABLE, BadTable, parse


def test_the_shipped_table_reads_and_every_row_names_a_source():
    data = json.loads(TABLE.read_text())
    for part in ("models", "arch_branches", "cuda_min_capability", "cuda_min_driver", "forward_compat"):
        assert data[part] and all(row["source"] in data["sources"] for row in data[part]), part
    assert SUPPORT.models["b200"].min_driver == "570.133.20"
    assert SUPPORT.models["rtxpro6000se"].datacenter and not SUPPORT.models["rtxpro6000"].datacenter
    assert not SUPPORT.models["gtx1660"].tensor_cores and SUPPORT.models["t4"].tensor_cores
    assert SUPPORT.arch_branches[(3, 7)] == (319, 470)
    assert SUPPORT.cuda_min_driver[(13, 2)] == "595.45.04" and SUPPORT.cuda_min_driver[(13, 3)] == "610.43.02"


@pytest.mark.parametrize(
    "cuda, branches",
    [
        ((12, 8), ("470", "535", "550", "560", "565")),  # each recorded release: its own list
        ((12, 9), ("535", "550", "560", "565", "570")),
        ((13, 0), ("535", "550", "565", "570", "575")),
        ((13, 1), ("535", "550", "570", "575", "580")),
        ((13, 2), ("535", "570", "580", "590")),
        ((12, 4), ("470.57", "535.86")),  # between two rows: what both allow, at the stricter minimum
        ((13, 3), ("535", "570", "580", "590")),  # past the newest row: the newest
        ((11, 8), ()),
    ],
)
def test_forward_branches_are_each_releases_own_and_an_unrecorded_release_gets_only_what_its_neighbours_share(
    cuda, branches
):
    assert SUPPORT.forward_branches(cuda) == branches


def test_no_release_between_two_rows_gets_a_branch_either_neighbour_dropped():
    rows = sorted(SUPPORT.forward_compat)
    for older, newer in zip(rows, rows[1:], strict=False):
        if older[0] != newer[0]:
            continue
        for minor in range(older[1] + 1, newer[1]):
            allowed = {b.split(".")[0] for b in SUPPORT.forward_branches((older[0], minor))}
            assert allowed <= {b.split(".")[0] for b in SUPPORT.forward_compat[older]}
            assert allowed <= {b.split(".")[0] for b in SUPPORT.forward_compat[newer]}


def test_a_release_own_driver_and_its_majors_minor_version_floor_are_two_facts():
    assert SUPPORT.cuda_min_driver[(11, 0)] == "450.51.05"
    assert SUPPORT.minor_version_floor(11) == "450.80.02"
    assert SUPPORT.minor_version_floor(12) == "525.60.13" and SUPPORT.minor_version_floor(13) == "580.65.06"


def test_jetson_drivers_are_read_on_their_own_scale_and_only_for_jetsons():
    assert SUPPORT.tegra_cuda("thor", "580.00") == (13, 0)
    assert SUPPORT.tegra_cuda("orin", "540.4.0") == (12, 6)
    assert SUPPORT.tegra_cuda("h100", "580.00") is None
    with pytest.raises(BadTable, match="tegra_drivers\\[0\\]: model must be a Jetson"):
        parse(_table(tegra_drivers=[{"model": "h100", "driver": "580.00", "cuda": "13.0", "source": "jetpack"}]))


def _table(**change):
    data = json.loads(TABLE.read_text())
    for part, rows in change.items():
        data[part] = rows
    return data


@pytest.mark.parametrize(
    "why, change, words",
    [
        (
            "a capability that is not MAJOR.MINOR",
            {"models": [{"key": "x1", "capability": "9", "datacenter": True, "source": "cuda-gpus"}]},
            "models[0]: capability",
        ),
        (
            "a capability as a number",
            {"models": [{"key": "x1", "capability": 9.0, "datacenter": True, "source": "cuda-gpus"}]},
            "models[0]: capability",
        ),
        (
            "a key with capitals",
            {"models": [{"key": "H100", "capability": "9.0", "datacenter": True, "source": "cuda-gpus"}]},
            "models[0]: needs a key",
        ),
        (
            "datacenter as text",
            {"models": [{"key": "x1", "capability": "9.0", "datacenter": "yes", "source": "cuda-gpus"}]},
            "datacenter must be",
        ),
        (
            "an unknown cpu",
            {"models": [{"key": "x1", "capability": "9.0", "datacenter": True, "cpu": "riscv", "source": "cuda-gpus"}]},
            "cpu any",
        ),
        (
            "a min driver that is no version",
            {
                "models": [
                    {"key": "x1", "capability": "9.0", "datacenter": True, "min_driver": "570.x", "source": "cuda-gpus"}
                ]
            },
            "driver '570.x'",
        ),
        (
            "a row without a source",
            {"arch_branches": [{"capability": "9.0", "first": 520, "last": None}]},
            "arch_branches[0]: names no source",
        ),
        ("a row that is not an object", {"cuda_min_driver": ["12.8=570.26"]}, "cuda_min_driver[0]: names no source"),
        (
            "a branch as text",
            {"arch_branches": [{"capability": "9.0", "first": "520", "last": None, "source": "cuda-11.8"}]},
            "branch numbers",
        ),
        (
            "a CUDA release of words",
            {"cuda_min_driver": [{"cuda": "twelve", "driver": "570.26", "source": "cuda-notes"}]},
            "cuda 'twelve'",
        ),
        (
            "a driver with a letter",
            {"cuda_min_driver": [{"cuda": "12.8", "driver": "570.26a", "source": "cuda-notes"}]},
            "driver '570.26a'",
        ),
        (
            "forward branches not a list",
            {"forward_compat": [{"cuda": "13.0", "branches": "535", "source": "cuda-13.0-image"}]},
            "branches must be a list",
        ),
        (
            "a forward branch of Arabic-Indic digits",
            {"forward_compat": [{"cuda": "13.0", "branches": ["\u0665\u0663\u0665"], "source": "cuda-13.0-image"}]},
            "forward_compat[0]",
        ),
    ],
)
def test_a_malformed_table_row_is_one_line_naming_it(why, change, words):
    with pytest.raises(BadTable) as caught:
        parse(_table(**change))
    said = str(caught.value)
    assert words in said and "\n" not in said, (why, said)


@pytest.mark.parametrize("document", [None, [], "x", {"models": []}, {"sources": []}])
def test_a_table_that_is_no_table_is_refused(document):
    with pytest.raises(BadTable):
        parse(document)


def test_the_matrices_in_the_docs_are_what_the_table_says_now():
    docs = (Path(__file__).parent.parent / "docs" / "gpus.md").read_text()
    for name, make in matrix.BLOCKS.items():
        assert matrix.block(docs, name) == make(), f"docs/gpus.md's {name} is stale: {matrix.COMMAND}"
    assert matrix.rewrite(docs) == docs


def test_the_model_matrix_covers_every_model_of_the_table_once_per_release():
    models = list(SUPPORT.models)
    assert len(models) >= 41
    jetson = [line.split()[1] for line in matrix.jetson_markdown().splitlines()[2:]]
    assert set(jetson) == set(matrix.jetson_models()) == {"orin", "thor"}
    for release in matrix.NGC_RELEASES_FACTS:
        rows = matrix.model_rows(release)
        named = [model for group, _ in rows for model in group]
        assert sorted(named + list(matrix.jetson_models())) == sorted(models), release.release
        assert all(len(cells) == len(matrix.BRANCHES) for _, cells in rows)


def _release(name: str) -> matrix.NgcRelease:
    return next(r for r in matrix.NGC_RELEASES_FACTS if r.release == name)


@pytest.mark.parametrize(
    "release, model, branch, expected",
    [
        ("25.10", "b200", 570, "fc ≥570.133.20"),  # a data-center model's own minimum within the branch
        ("25.10", "rtx4090", 570, "no"),  # a GeForce: no forward compatibility
        ("25.10", "b300", 570, "no"),  # an architecture newer than the branch drives
        ("25.10", "b300", 575, "fc"),
        ("25.10", "h100", 580, "yes ≥580.65.06"),  # CUDA 13.0's own driver
        ("26.01", "h100", 580, "fc, yes ≥580.65.06"),  # R580 is in CUDA 13.1's forward list
        ("26.03", "h100", 550, "no"),  # CUDA 13.2's list dropped R550
        ("25.06", "h100", 470, "no"),  # CUDA 12.9's dropped R470
        ("24.05", "v100", 470, "fc ≥470.57"),
        ("25.10", "v100", 610, "-"),  # no kernels for Volta in CUDA 13
        ("24.05", "v100", 590, "no"),  # R580 is Volta's last branch
        ("24.05", "b200", 570, "yes* ≥570.133.20"),  # only 9.0 PTX for Blackwell in a CUDA 12.4 image
        ("25.10", "rtxpro6000se", 575, "fc ≥575.57.08"),
    ],
)
def test_a_model_matrix_cell_is_what_the_branch_does_for_that_gpu(release, model, branch, expected):
    assert matrix.branch_cell(_release(release), parse_target(model), branch) == expected


@pytest.mark.parametrize(
    "release, model, driver, expected",
    [
        ("25.10", "thor", "580.00", "yes"),  # JetPack 7's own driver runs CUDA 13.0
        ("26.01", "orin", "540.4.0", "no"),  # JetPack 6 runs no CUDA 13
        ("25.10", "orin", "540.4.0", "-"),  # 25.10's arm64 image has no sm_87
        ("24.05", "orin", "540.3.0", "yes"),  # 12.4 on JetPack 6.0's 12.2 by minor-version compatibility
    ],
)
def test_jetson_models_are_judged_on_their_own_jetpack_drivers(release, model, driver, expected):
    assert matrix.kind(_release(release), parse_target(model), driver) == expected


def test_every_model_cell_agrees_with_the_verdict_at_a_released_driver_of_its_branch():
    kinds = {}  # one model of each kind: models of the same facts get the same verdicts
    for key in matrix.desktop_models():
        model = SUPPORT.models[key]
        kinds.setdefault((model.capability, model.datacenter, model.cpu, model.min_driver), key)
    for release in matrix.NGC_RELEASES_FACTS:
        for key in kinds.values():
            target = parse_target(key)
            for driver in matrix.DRIVERS:
                cell = matrix.branch_cell(release, target, int(driver.split(".")[0]))
                last = cell.split(", ")[-1].split(" ")[0].rstrip("*")
                verdict = judge_tag(
                    release.release, release.cuda, release.archs, [target], driver, (), release.variants
                )
                assert verdict[0].runs == (last in ("yes", "fc")), (release.release, key, driver, cell)


def test_the_matrix_script_rewrites_a_stale_copy_and_refuses_other_arguments(tmp_path, capsys):
    docs = tmp_path / "gpus.md"
    stale = (Path(__file__).parent.parent / "docs" / "gpus.md").read_text().replace("| fc ≥", "| yes ≥", 1)
    docs.write_text(stale)
    assert matrix.main(["--write", str(docs)]) == 0
    assert docs.read_text() == matrix.rewrite(stale) != stale
    assert matrix.main(["--bogus"]) == 2 and "usage" in capsys.readouterr().err


@pytest.mark.parametrize(
    "release, driver, expected",
    [
        ("25.06", "470.256.02", "no"),  # CUDA 12.9's list dropped R470
        ("26.01", "565.57.01", "no"),  # CUDA 13.1's dropped R565
        ("26.03", "550.163.01", "no"),  # CUDA 13.2's dropped R550 and R575
        ("26.03", "575.64.05", "no"),
        ("26.03", "570.195.03", "data center"),
        ("25.10", "580.95.05", "all"),
        ("24.05", "470.256.02", "data center"),
    ],
)
def test_the_matrix_follows_each_releases_own_list(release, driver, expected):
    cuda = dict(matrix.NGC_RELEASES)[release]
    assert matrix.cell(cuda, driver) == expected


def _parses_a_version(node: ast.AST) -> bool:
    """`int(...)` over a `.split(".")` piece, or a comprehension of `int(...)` over `.split(".")`/`re.findall`: a
    dotted version read into numbers."""

    def splits(tree: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and (
                (n.func.attr in {"split", "rsplit"} and n.args[:1] and ast.unparse(n.args[0]) in {"'.'", '"."'})
                or n.func.attr == "findall"
            )
            for n in ast.walk(tree)
        )

    def is_int(call: ast.AST) -> bool:
        return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "int"

    if isinstance(node, (ast.GeneratorExp, ast.ListComp)) and is_int(node.elt):
        return any(splits(gen.iter) for gen in node.generators)
    return is_int(node) and any(splits(arg) for arg in node.args)  # type: ignore[attr-defined]


def test_a_dotted_version_is_read_into_numbers_in_one_place():
    """Driver, toolkit and capability versions compare as gpu.toolkit.version_tuple reads them: a parser of its
    own (fleet's skipped `05-beta`, support's took only the branch) compared the same version differently. The
    in-image payload is stdlib only and reads its own."""
    package = Path(__file__).resolve().parent.parent / "imgbuild"
    found = {}
    for module in sorted(package.rglob("*.py")):
        if "payload" in module.parts:
            continue
        count = sum(map(_parses_a_version, ast.walk(ast.parse(module.read_text(encoding="utf-8")))))
        if count:
            found[module.relative_to(package).as_posix()] = count
    assert found == {"gpu/toolkit.py": 1}
