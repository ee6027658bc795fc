"""loader.examples.images: the image benchmark's mapper (decode, crop, flip, normalise) and folder reader."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from loader.errors import MissingDependencyError
from loader.examples import images

Image = pytest.importorskip("PIL.Image")


def jpeg(width: int = 256, height: int = 240, mode: str = "RGB", seed: int = 0) -> bytes:
    """A JPEG with structure in both directions, so a shifted or flipped crop shows."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").convert(mode).save(out, "JPEG", quality=95)
    return out.getvalue()


def sample(data: bytes, label: int = 7) -> list[np.ndarray]:
    return [np.frombuffer(data, np.uint8), np.int64(label)]


def test_output_shape_dtype_and_label_pass_through() -> None:
    out, label = images.decode_crop_flip(sample(jpeg()), np.random.default_rng(0))
    assert out.shape == (3, images.CROP, images.CROP)
    assert out.dtype == np.float32
    assert out.flags.c_contiguous
    assert label == 7


@pytest.mark.parametrize("seed", range(6))
def test_crop_flip_and_normalisation_follow_the_generator(seed: int) -> None:
    data = jpeg()
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    height, width, _ = decoded.shape
    draws = np.random.default_rng(seed)  # the same draws, in the mapper's order: left, top, flip
    left = int(draws.integers(0, width - images.CROP + 1))
    top = int(draws.integers(0, height - images.CROP + 1))
    flip = draws.random() < 0.5
    crop = decoded[top : top + images.CROP, left : left + images.CROP]
    if flip:
        crop = crop[:, ::-1]
    expected = ((crop.astype(np.float32) - images.MEAN) / images.STD).transpose(2, 0, 1)

    out, _ = images.decode_crop_flip(sample(data), np.random.default_rng(seed))

    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_same_generator_same_output_and_seeds_differ() -> None:
    data = sample(jpeg())
    first = images.decode_crop_flip(data, np.random.default_rng(42))[0]
    again = images.decode_crop_flip(data, np.random.default_rng(42))[0]
    np.testing.assert_array_equal(first, again)
    others = [images.decode_crop_flip(data, np.random.default_rng(s))[0] for s in range(4)]
    assert any(not np.array_equal(first, other) for other in others)


def test_greyscale_jpeg_becomes_three_equal_channels() -> None:
    out, _ = images.decode_crop_flip(sample(jpeg(mode="L")), np.random.default_rng(1))
    assert out.shape == (3, images.CROP, images.CROP)
    pixels = out * images.STD.reshape(3, 1, 1) + images.MEAN.reshape(3, 1, 1)
    np.testing.assert_allclose(pixels[0], pixels[1], atol=1e-3)
    np.testing.assert_allclose(pixels[1], pixels[2], atol=1e-3)


def test_an_image_smaller_than_the_crop_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller than the 224x224 crop"):
        images.decode_crop_flip(sample(jpeg(width=200, height=256)), np.random.default_rng(0))


def test_read_image_file_labels_by_sorted_class_folder(tmp_path) -> None:
    paths = {}
    for label_name in ("dog", "cat", "emu"):
        folder = tmp_path / label_name
        folder.mkdir()
        paths[label_name] = folder / "one.jpg"
        paths[label_name].write_bytes(jpeg(seed=len(label_name)))
    for expected, name in enumerate(["cat", "dog", "emu"]):
        samples = list(images.read_image_file(str(paths[name]))())
        assert len(samples) == 1
        data, label = samples[0]
        assert data.dtype == np.uint8 and data.tobytes() == paths[name].read_bytes()
        assert int(label) == expected


def test_without_pillow_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # `from PIL import Image` now raises ImportError
    with pytest.raises(MissingDependencyError, match="Pillow"):
        images.decode_crop_flip(sample(b"\xff\xd8"), np.random.default_rng(0))
