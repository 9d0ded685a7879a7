"""The shipped catalogue files (pure: no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marketplace import catalogue
from marketplace.catalogue import DATASET, MODEL, CatalogueError


def test_the_shipped_catalogue_has_at_least_300_models_and_1100_datasets() -> None:
    models = list(catalogue.read_assets(MODEL))
    datasets = list(catalogue.read_assets(DATASET))
    assert len(models) >= 300
    assert len(datasets) >= 1100


def test_every_asset_has_a_unique_valid_slug_a_source_and_a_name() -> None:
    for kind in (MODEL, DATASET):
        records = list(catalogue.read_assets(kind))
        slugs = [r.slug for r in records]
        assert len(slugs) == len(set(slugs))
        for r in records:
            assert catalogue.is_valid_slug(r.slug), r.hub_id
            assert r.source and r.name and r.tasks is not None


def test_slug_is_the_lowercased_hub_id_with_a_double_dash() -> None:
    assert catalogue.slug_for("meta-llama/Llama-2-7b-hf") == "meta-llama--llama-2-7b-hf"
    assert catalogue.slug_for("squad") == "squad"


@pytest.mark.parametrize("hub_id", ["../etc", "a/b/c", "a/..", "", "a b", "/abs", "a/.hidden"])
def test_slug_for_refuses_what_is_not_a_hub_id(hub_id: str) -> None:
    with pytest.raises(CatalogueError):
        catalogue.slug_for(hub_id)


def test_a_model_without_a_size_gets_an_estimate_from_its_parameters() -> None:
    llama = next(r for r in catalogue.read_assets(MODEL) if r.hub_id == "meta-llama/Llama-2-7b-hf")
    assert llama.params_billion == pytest.approx(6.738)
    assert llama.size_gb == pytest.approx(13.476)
    assert llama.size_estimated is True


def test_a_size_given_by_the_source_is_kept_and_not_marked_estimated(tmp_path: Path) -> None:
    path = tmp_path / "models.csv"
    path.write_text(
        "hub_id,name,publisher,task,modality,params_billion,size_gb,license,source\n"
        'org/with-size,with-size,org,text-to-image,"text,image",2.6,6.94,mit,x:y@1\n'
        "org/nothing,nothing,org,embedding,text,,,,x:y@1\n",
        encoding="utf-8",
    )
    with_size, nothing = catalogue.read_assets(MODEL, path)
    assert (with_size.size_gb, with_size.size_estimated) == (6.94, False)
    assert with_size.modalities == ("text", "image")
    assert (nothing.size_gb, nothing.size_estimated, nothing.license) == (None, False, "")


def test_dataset_tasks_are_split_and_the_first_is_the_primary_task() -> None:
    ade = next(r for r in catalogue.read_assets(DATASET) if r.hub_id == "ade_corpus_v2")
    assert ade.tasks == ("text-classification", "token-classification")
    assert ade.task == "text-classification"
    assert ade.size_estimated is False


def test_a_bad_number_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "models.csv"
    path.write_text(
        "hub_id,name,publisher,task,modality,params_billion,size_gb,license,source\n"
        "org/m,m,org,embedding,text,seven,,,x:y@1\n",
        encoding="utf-8",
    )
    with pytest.raises(CatalogueError, match="models.csv:2"):
        list(catalogue.read_assets(MODEL, path))


def test_llama_and_gemma_licenses_are_gated_and_apache_is_not() -> None:
    licenses = catalogue.read_licenses()
    for key in ("llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "gemma"):
        assert licenses[key].gated, key
        assert licenses[key].url.startswith("https://")
    assert not licenses["apache-2.0"].gated
    assert catalogue.license_record("cc-by-nd-4.0", licenses).gated is False


def test_images_cover_the_four_frameworks_with_several_versions_each() -> None:
    images = {i.framework: i for i in catalogue.read_images()}
    for framework in ("PyTorch", "DeepSpeed", "Megatron-LM", "Colossal-AI"):
        assert len(images[framework].versions) >= 3, framework
        assert sum(v.recommended for v in images[framework].versions) == 1
    assert any(
        v.framework_version.startswith("2.1") and v.container.startswith("pytorch/pytorch:2.1")
        for v in images["PyTorch"].versions
    )
    assert images["Megatron-LM"].versions[0].container == "nvcr.io/nvidia/pytorch:23.10-py3"


def test_every_image_version_has_a_launch_template_with_jupyterlab_on_8888() -> None:
    for image in catalogue.read_images():
        for v in image.versions:
            assert catalogue.CONTAINER_RE.fullmatch(v.container), v.container
            assert v.cuda and v.python and v.size_gb > 0 and v.gpus
            assert any(p.port == 8888 and p.name == "JupyterLab" for p in v.launch.ports)
            assert "8888" in v.launch.command
            assert v.launch.env["HF_HUB_OFFLINE"] == "1"


def test_version_launch_overrides_merge_over_the_image_and_defaults() -> None:
    megatron = next(i for i in catalogue.read_images() if i.slug == "megatron-lm")
    launch = megatron.versions[0].launch
    assert launch.env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # image level
    assert launch.env["NCCL_IB_DISABLE"] == "0"  # defaults
    assert launch.workdir == "/workspace/Megatron-LM"


def test_cuda_11_3_image_does_not_claim_rtx_4090_or_h800() -> None:
    for image in catalogue.read_images():
        for v in image.versions:
            if v.cuda.startswith("11.") and float(v.cuda[3:]) < 8:
                assert set(v.gpus) == {"A800"}, v.slug


def test_a_bad_container_reference_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text(
        "images:\n- slug: x\n  name: X\n  framework: X\n  versions:\n"
        "  - {slug: x-1, framework_version: '1', cuda: '12.1', python: '3.10',"
        " container: 'Not A Ref', size_gb: 1, gpus: [A800]}\n",
        encoding="utf-8",
    )
    with pytest.raises(CatalogueError, match="container"):
        catalogue.read_images(path)
