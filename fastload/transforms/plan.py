"""A transform chain folded into a ``Plan``: what the C pipeline does per
sample (csrc reads its fields by name).

``compile_plan`` checks the chain's order and folds each transform in.  It
knows the transforms by their ``op`` name (``ops.py`` defines the classes
and imports this module to compile them), so a subclass compiles as its
base does.
"""

__all__ = ["AUTO_POLICIES", "FILTERS", "Plan", "compile_plan"]

# Interpolation names and the C pipeline's filter numbers.
FILTERS = {"nearest": 0, "bilinear": 1, "bicubic": 2}
# AutoAugment's tables, in the C pipeline's order (csrc/core/image/pil_ops.h).
AUTO_POLICIES = ("imagenet", "cifar10", "svhn")

_GEOMETRY = ("random_resized_crop", "resize", "center_crop")
_WARPS = ("rotation", "affine")
_AUGMENT = ("rand_augment", "trivial_augment", "auto_augment")


class Plan:
    """A compiled transform chain: what the C pipeline does per sample.

    Fields (plain numbers and strings, read by name in csrc/bind/image/image_plan.c):
    ``crop``: 0 none, 1 random-resized, 2 resize-then-center-crop (either
    part may be absent); ``out_h``/``out_w`` (0: the decoded size, only
    without geometry); ``scale``/``ratio`` (random-resized);
    ``resize``/``resize_hw``/``max_size`` and ``crop_hw`` (the other kind);
    ``filter``, ``antialias``; ``flip_p``; colour ops on the resized image:
    ``brightness``/``contrast``/``saturation``/``hue`` factor ranges
    ((1, 1) and, for hue, (0, 0): off), ``jitter_order`` (None: a random
    order per image; a permutation of 0..3 fixes it, for tests),
    ``gray_p`` (grayscale probability), ``gray_first`` (grayscale before the
    jitter), ``color_uint8`` (those ops as on a uint8 tensor, each step
    truncated); crop 3 is RandomCrop (``crop_hw`` its size, after a Resize or
    with ``pad_left_right``/``pad_top_bottom``, ``pad_if_needed``,
    ``pad_once`` (v2's one pad), ``pad_mode`` and ``pad_fill``, RGB);
    ``jitter_p`` (RandomApply of the jitter); ``blur_kernel`` (x, y; (0, 0):
    no blur), ``blur_sigma`` (min, max), ``blur_p``; ``dtype`` ("uint8", "float32",
    "float16"); ``layout`` ("CHW", "HWC"); ``mul``/``add``: per channel,
    out = value_0_255 * mul + add; ``tensor_output``: the transform converts to
    a tensor (else the output is an HWC uint8 image, as PIL would hold it);
    RandomErasing on the stored row: ``erase_p`` (0: off), ``erase_scale``,
    ``erase_ratio``, ``erase_value`` (per channel, in the row's units) and
    ``erase_random`` (standard normal values instead).
    """

    def __init__(self):
        self.crop = 0
        self.out_h = self.out_w = 0
        self.scale = (0.0, 0.0)
        self.ratio = (0.0, 0.0)
        self.resize = 0            # short side, or 0
        self.resize_hw = (0, 0)    # exact (height, width), or (0, 0)
        self.max_size = 0
        self.crop_hw = (0, 0)
        self.filter = FILTERS["bilinear"]
        self.antialias = True
        self.flip_p = 0.0
        self.brightness = (1.0, 1.0)
        self.contrast = (1.0, 1.0)
        self.saturation = (1.0, 1.0)
        self.hue = (0.0, 0.0)
        self.jitter_order = None
        self.gray_p = 0.0
        self.gray_first = False
        self.dtype = "uint8"
        self.layout = "HWC"
        self.channels = 3          # 1: Grayscale(1), the first of three equal channels
        self.gray_at_decode = False  # a leading Grayscale(pil=True): on the decoded pixels
        self.mul = (1.0, 1.0, 1.0)
        self.add = (0.0, 0.0, 0.0)
        self.tensor_output = False
        self.pad_left_right = (0, 0)
        self.pad_top_bottom = (0, 0)
        self.pad_if_needed = False
        self.pad_once = False
        self.pad_mode = "constant"
        self.pad_fill = (0, 0, 0)
        self.jitter_p = 1.0
        self.blur_kernel = (0, 0)
        self.blur_sigma = (0.0, 0.0)
        self.blur_p = 0.0
        self.erase_p = 0.0
        self.erase_scale = (0.0, 0.0)
        self.erase_ratio = (1.0, 1.0)
        self.erase_value = (0.0, 0.0, 0.0)
        self.erase_random = False
        # RandAugment / TrivialAugmentWide / AutoAugment on the resampled
        # uint8 image (csrc/core/image/pil_ops.h): policy 0 none, 1 rand,
        # 2 trivial, 3 auto; its table 0 imagenet, 1 cifar10, 2 svhn;
        # interpolation 0 nearest, 1 bilinear; fill 0..255 per channel.
        self.augment = 0
        self.augment_num_ops = 0
        self.augment_magnitude = 0
        self.augment_bins = 0
        self.augment_table = 0
        self.augment_interpolation = 0
        self.augment_fill = (0.0, 0.0, 0.0)
        # RandomRotation / RandomAffine on that uint8 image, before the
        # policy (csrc/core/image/random_affine.h): warp 0 none, 1 rotation,
        # 2 affine; degrees (min, max); translate: the largest shift as a
        # fraction of (width, height); scale and shears (min, max);
        # interpolation and fill as above; center when has_center.
        self.warp = 0
        self.warp_degrees = (0.0, 0.0)
        self.warp_translate = (0.0, 0.0)
        self.warp_scale = (1.0, 1.0)
        self.warp_shear_x = (0.0, 0.0)
        self.warp_shear_y = (0.0, 0.0)
        self.warp_interpolation = 0
        self.warp_fill = (0.0, 0.0, 0.0)
        self.warp_has_center = False
        self.warp_center = (0.0, 0.0)
        # The colour ops above with Pillow's arithmetic, on the uint8 image
        # after the policy (csrc/core/image/pil_color.h), instead of on floats.
        self.color_pil = False
        self.color_uint8 = False  # colour ops as on a uint8 tensor (ColorJitter(uint8=True))
        # the policy's Solarize thresholds are torchvision.transforms.v2's
        self.augment_solarize_v2 = False
        # RandomAffine's matrix is torchvision.transforms.v2's
        self.warp_v2 = False

    def output_shape(self):
        """(C, H, W) or (H, W, C); None when it depends on the image."""
        if not self.out_h:
            return None
        c = self.channels
        return (c, self.out_h, self.out_w) if self.layout == "CHW" else (self.out_h, self.out_w, c)


def compile_plan(transforms, channels_last=False):
    """Checks the chain's order and folds it into a Plan; ValueError says
    which transform is out of place."""
    plan = Plan()
    # 0 geometry, 1 flip, 2 colour, 3 blur, 4 tensor conversion, 5 dtype, 6 normalize,
    # 7 erasing
    stage = 0

    def out_of_place(t):
        raise ValueError(
            f"fastload.transforms.Compose cannot fuse {t!r} here: the order must be "
            "[Grayscale(pil=True)], "
            "[RandomResizedCrop | Resize [CenterCrop | RandomCrop] | CenterCrop | RandomCrop], "
            "[RandomHorizontalFlip], [RandomRotation | RandomAffine], "
            "[RandAugment | TrivialAugmentWide | AutoAugment], "
            "[ColorJitter] [RandomGrayscale | Grayscale] (either order), [GaussianBlur], "
            "[ToTensor | PILToTensor [ConvertImageDtype]], [Normalize], [RandomErasing]")

    dtype = "uint8"
    normalize = None
    jitter = gray = blur = augment = warp = None
    for t in transforms:
        applied = 1.0
        if getattr(t, "op", None) == "apply":
            applied, t = t.p, t.transforms[0]
        op = getattr(t, "op", None)
        if op == "random_crop":
            if stage > 0 or plan.crop not in (0, 2) or plan.crop_hw != (0, 0):
                out_of_place(t)
            if plan.crop == 2 and t.pads:
                raise ValueError(
                    f"fastload.transforms.Compose cannot fuse {t!r} after a Resize: "
                    "RandomCrop pads only as the first geometric step")
            if plan.crop == 0:
                plan.filter = FILTERS["nearest"]  # whole pixels, 1:1
                left, top, right, bottom = t.padding_ltrb
                plan.pad_left_right, plan.pad_top_bottom = (left, right), (top, bottom)
                plan.pad_if_needed, plan.pad_once = t.pad_if_needed, t.pad_once
                plan.pad_mode, plan.pad_fill = t.padding_mode, t.fill_rgb
            plan.crop = 3
            plan.crop_hw = t.size
            plan.out_h, plan.out_w = t.size
        elif op in _GEOMETRY:
            if stage > 0:
                out_of_place(t)
            if op == "random_resized_crop":
                if plan.crop != 0:
                    out_of_place(t)
                plan.crop = 1
                plan.out_h, plan.out_w = t.size
                plan.scale, plan.ratio = t.scale, t.ratio
                plan.filter, plan.antialias = FILTERS[t.interpolation], t.antialias
            elif op == "resize":
                if plan.crop != 0:
                    out_of_place(t)
                plan.crop = 2
                if isinstance(t.size, int):
                    plan.resize, plan.max_size = t.size, t.max_size or 0
                else:
                    plan.resize_hw = t.size
                    plan.out_h, plan.out_w = t.size
                plan.filter, plan.antialias = FILTERS[t.interpolation], t.antialias
            else:  # CenterCrop
                if plan.crop == 1 or plan.crop_hw != (0, 0):
                    out_of_place(t)
                plan.crop = 2
                plan.crop_hw = t.size
                plan.out_h, plan.out_w = t.size
        elif op == "flip":
            # A flip commutes exactly with the colour ops and the blur (a
            # symmetric kernel, symmetric padding): it may follow them, but
            # not a rotation's or an augmentation's warps, which run after it.
            if stage > 3 or plan.flip_p or augment is not None or warp is not None:
                out_of_place(t)
            plan.flip_p = t.p
            stage = max(stage, 1)
        elif op in _WARPS:
            if stage > 1 or warp is not None or augment is not None:
                out_of_place(t)
            if op == "rotation" and t.expand:
                raise ValueError(f"fastload.transforms.Compose cannot fuse {t!r}: expand=True "
                                 "makes the output size differ per image")
            warp = t
            plan.warp = 1 + _WARPS.index(op)
            plan.warp_degrees = t.degrees
            plan.warp_interpolation = FILTERS[t.interpolation]
            plan.warp_fill = tuple(float(v) for v in t.fill)
            plan.warp_has_center = t.center is not None
            plan.warp_center = t.center or (0.0, 0.0)
            plan.warp_v2 = op == "affine" and t.matrix_v2
            if op == "affine":
                plan.warp_translate = t.translate or (0.0, 0.0)
                plan.warp_scale = t.scale or (1.0, 1.0)
                if t.shear is not None:
                    plan.warp_shear_x = t.shear[:2]
                    plan.warp_shear_y = t.shear[2:] or (0.0, 0.0)
            stage = 1
        elif op in _AUGMENT:
            if stage > 1 or augment is not None:
                out_of_place(t)
            augment = t
            plan.augment = 1 + _AUGMENT.index(op)
            plan.augment_interpolation = FILTERS[t.interpolation]
            plan.augment_fill = tuple(float(v) for v in t.fill)
            if op == "rand_augment":
                plan.augment_num_ops = t.num_ops
                plan.augment_magnitude = t.magnitude
            if op in ("rand_augment", "trivial_augment"):
                plan.augment_bins = t.num_magnitude_bins
            if op == "auto_augment":
                plan.augment_table = AUTO_POLICIES.index(t.policy)
            plan.augment_solarize_v2 = t.solarize_v2
            stage = 1
        elif op == "color_jitter":
            if stage > 2 or jitter is not None:
                out_of_place(t)
            jitter = t
            plan.jitter_p = applied
            stage = 2
        elif op == "blur":
            if stage > 3 or blur is not None:
                out_of_place(t)
            blur = t
            plan.blur_kernel, plan.blur_sigma, plan.blur_p = t.kernel_size, t.sigma, applied
            stage = 3
        elif (op == "grayscale" and t.pil and stage == 0 and plan.crop == 0
              and not plan.gray_at_decode):
            # First of all, as torchvision converts the PIL image: the decoded
            # pixels are made gray, then the geometry resamples them.
            plan.gray_at_decode = True
            if t.num_output_channels == 1:
                plan.channels = 1
        elif op in ("random_grayscale", "grayscale"):
            if stage > 2 or gray is not None:
                out_of_place(t)
            gray = t
            plan.gray_p = t.p if op == "random_grayscale" else 1.0
            plan.gray_first = jitter is None
            if op == "grayscale" and t.num_output_channels == 1:
                plan.channels = 1
            stage = 2
        elif op in ("to_tensor", "pil_to_tensor"):
            if stage >= 4:
                out_of_place(t)
            dtype = "float32" if op == "to_tensor" else "uint8"
            plan.tensor_output = True
            stage = 4
        elif op == "convert_dtype":
            if stage != 4:
                out_of_place(t)
            if t.dtype != "uint8":
                dtype = t.dtype
            stage = 5
        elif op == "normalize":
            if stage == 7:
                out_of_place(t)
            if stage not in (4, 5) or dtype == "uint8":
                raise ValueError("Normalize needs a float image: put ToTensor (or PILToTensor "
                                 "and ConvertImageDtype) before it")
            normalize = t
            stage = 6
        elif op == "erasing":
            if stage < 4:
                raise ValueError("RandomErasing needs a tensor: put ToTensor (or PILToTensor) "
                                 "and Normalize before it")
            if stage == 7:
                out_of_place(t)
            plan.erase_p = t.p
            plan.erase_scale, plan.erase_ratio = t.scale, t.ratio
            if t.value == "random":
                plan.erase_random = True
            else:
                if len(t.value) > plan.channels:
                    raise ValueError("If value is a sequence, it should have either a single "
                                     f"value or {plan.channels} (got {len(t.value)})")
                plan.erase_value = t.value * (3 // len(t.value))
            stage = 7
        else:
            raise TypeError(
                f"{type(t).__name__} is not a fastload transform; give the dataset a plain "
                "callable instead (it then runs in Python on the decoded image)")
    if jitter is not None and gray is not None and (jitter.pil, jitter.uint8) != (gray.pil,
                                                                                gray.uint8):
        raise ValueError(f"fastload.transforms.Compose cannot fuse {jitter!r} with {gray!r}: "
                         "both need the same arithmetic (pil=True, uint8=True or neither)")
    plan.color_pil = any(t is not None and t.pil for t in (jitter, gray))
    plan.color_uint8 = any(t is not None and t.uint8 for t in (jitter, gray))
    if plan.color_uint8 and blur is not None:
        raise ValueError(f"fastload.transforms.Compose cannot fuse {blur!r} after uint8=True "
                         "colour ops: torchvision rounds a uint8 blur, which fastload's float "
                         "blur does not")
    if plan.channels == 1 and not plan.tensor_output:
        raise ValueError("fastload.transforms.Compose cannot fuse Grayscale(num_output_channels"
                         "=1) without ToTensor or PILToTensor after it: fastload's images are "
                         "RGB until then")
    if plan.gray_at_decode:
        fills = [plan.pad_fill, plan.warp_fill, plan.augment_fill]
        if any(len(set(fill)) > 1 for fill in fills):
            raise ValueError("fastload.transforms.Compose cannot fuse a fill of three different "
                             "values after a leading Grayscale: the image has one band there")
    if jitter is not None:
        plan.brightness = jitter.brightness or plan.brightness
        plan.contrast = jitter.contrast or plan.contrast
        plan.saturation = jitter.saturation or plan.saturation
        plan.hue = jitter.hue or plan.hue
    if plan.crop == 2 and plan.resize and not plan.crop_hw[0]:
        plan.out_h = plan.out_w = 0  # Resize(int) alone: the size depends on the image
    plan.dtype = dtype
    plan.layout = "HWC" if (channels_last or not plan.tensor_output) else "CHW"
    unit = 1.0 / 255.0 if dtype != "uint8" else 1.0
    if normalize is not None:
        if plan.channels == 1 and 3 in (len(normalize.mean), len(normalize.std)):
            raise ValueError(f"{normalize!r} has 3 channels' statistics for the 1 channel of "
                             "Grayscale(num_output_channels=1)")
        mean = normalize.mean * (3 // len(normalize.mean))
        std = normalize.std * (3 // len(normalize.std))
        plan.mul = tuple(unit / s for s in std)
        plan.add = tuple(-m / s for m, s in zip(mean, std))
    else:
        plan.mul = (unit,) * 3
    return plan
