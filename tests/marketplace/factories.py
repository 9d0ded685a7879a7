from __future__ import annotations

import factory

from marketplace.catalogue import slug_for
from marketplace.choices import AssetKind
from marketplace.models import Asset, Image, ImageVersion, License


class LicenseFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = License
        django_get_or_create = ("key",)

    key = factory.Sequence(lambda n: f"license-{n}")
    name = factory.LazyAttribute(lambda o: o.key.upper())
    url = "https://example.org/license"
    requires_acceptance = False


class AssetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Asset

    kind = AssetKind.MODEL
    publisher = "acme"
    hub_id = factory.LazyAttributeSequence(lambda o, n: f"{o.publisher}/model-{n}")
    slug = factory.LazyAttribute(lambda o: slug_for(o.hub_id))
    name = factory.LazyAttribute(lambda o: o.hub_id.split("/")[-1])
    task = "text-generation"
    tasks = factory.LazyAttribute(lambda o: o.task)
    modalities = "text"
    params_billion = 1.0
    size_gb = 2.0
    license = factory.SubFactory(LicenseFactory, key="apache-2.0", name="Apache License 2.0")
    source = "test:factory@0"


class ImageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Image

    slug = factory.Sequence(lambda n: f"image-{n}")
    name = factory.Sequence(lambda n: f"Image {n}")
    framework = "PyTorch"


class ImageVersionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ImageVersion

    image = factory.SubFactory(ImageFactory)
    slug = factory.Sequence(lambda n: f"version-{n}")
    framework_version = "2.1.2"
    cuda = "12.1"
    python = "3.10"
    container = "pytorch/pytorch:2.1.2-cuda12.1-cudnn8-devel"
    size_gb = 8.6
    gpu_models = factory.LazyFunction(lambda: ["RTX4090", "A800", "H800"])
    launch = factory.LazyFunction(
        lambda: {
            "command": "jupyter lab --port=8888",
            "workdir": "/workspace",
            "ports": [{"name": "JupyterLab", "port": 8888, "protocol": "http"}],
            "env": {},
        }
    )
