"""A self-contained PyTorch definition of YOLOX-Nano (test tooling only).

Mirrors Megvii's YOLOX (Apache-2.0) module structure and names: Focus stem, depthwise CSPDarknet
(depth 0.33, width 0.25), YOLOPAFPN, decoupled YOLOXHead. With ``decode_in_inference=False`` (the
default of YOLOX's ``tools/export_onnx.py``) the head returns the raw layout
``[B, N, 5 + nc]``: box ``(px, py, pw, ph)`` un-decoded, objectness and class scores sigmoided.
"""
from __future__ import annotations

import torch
from torch import nn


class SiLU(nn.Module):
    """x * sigmoid(x); YOLOX's export swaps nn.SiLU for this so ONNX gets Sigmoid + Mul."""

    def forward(self, x):
        return x * torch.sigmoid(x)


class BaseConv(nn.Module):
    """Conv2d (no bias) -> BatchNorm2d -> SiLU."""

    def __init__(self, cin, cout, ksize, stride, groups=1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, ksize, stride, (ksize - 1) // 2, groups=groups, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.03)
        self.act = SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class DWConv(nn.Module):
    """Depthwise k x k conv followed by a pointwise 1x1 conv."""

    def __init__(self, cin, cout, ksize, stride=1):
        super().__init__()
        self.dconv = BaseConv(cin, cin, ksize, stride, groups=cin)
        self.pconv = BaseConv(cin, cout, 1, 1)

    def forward(self, x):
        return self.pconv(self.dconv(x))


class Bottleneck(nn.Module):
    def __init__(self, cin, cout, shortcut=True, expansion=0.5):
        super().__init__()
        hidden = int(cout * expansion)
        self.conv1 = BaseConv(cin, hidden, 1, 1)
        self.conv2 = DWConv(hidden, cout, 3, 1)
        self.use_add = shortcut and cin == cout

    def forward(self, x):
        y = self.conv2(self.conv1(x))
        return y + x if self.use_add else y


class SPPBottleneck(nn.Module):
    def __init__(self, cin, cout, ks=(5, 9, 13)):
        super().__init__()
        hidden = cin // 2
        self.conv1 = BaseConv(cin, hidden, 1, 1)
        self.m = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in ks)
        self.conv2 = BaseConv(hidden * (len(ks) + 1), cout, 1, 1)

    def forward(self, x):
        x = self.conv1(x)
        return self.conv2(torch.cat([x] + [m(x) for m in self.m], 1))


class CSPLayer(nn.Module):
    def __init__(self, cin, cout, n=1, shortcut=True, expansion=0.5):
        super().__init__()
        hidden = int(cout * expansion)
        self.conv1 = BaseConv(cin, hidden, 1, 1)
        self.conv2 = BaseConv(cin, hidden, 1, 1)
        self.conv3 = BaseConv(2 * hidden, cout, 1, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, 1.0) for _ in range(n)))

    def forward(self, x):
        return self.conv3(torch.cat((self.m(self.conv1(x)), self.conv2(x)), 1))


class Focus(nn.Module):
    """Space-to-depth: 4 strided slices concatenated (tl, bl, tr, br), then a conv."""

    def __init__(self, cin, cout, ksize=3):
        super().__init__()
        self.conv = BaseConv(cin * 4, cout, ksize, 1)

    def forward(self, x):
        tl, tr = x[..., ::2, ::2], x[..., ::2, 1::2]
        bl, br = x[..., 1::2, ::2], x[..., 1::2, 1::2]
        return self.conv(torch.cat((tl, bl, tr, br), 1))


class CSPDarknet(nn.Module):
    def __init__(self, dep_mul=0.33, wid_mul=0.25):
        super().__init__()
        bc, bd = int(wid_mul * 64), max(round(dep_mul * 3), 1)
        self.stem = Focus(3, bc, 3)
        self.dark2 = nn.Sequential(DWConv(bc, bc * 2, 3, 2), CSPLayer(bc * 2, bc * 2, bd))
        self.dark3 = nn.Sequential(DWConv(bc * 2, bc * 4, 3, 2), CSPLayer(bc * 4, bc * 4, bd * 3))
        self.dark4 = nn.Sequential(DWConv(bc * 4, bc * 8, 3, 2), CSPLayer(bc * 8, bc * 8, bd * 3))
        self.dark5 = nn.Sequential(DWConv(bc * 8, bc * 16, 3, 2), SPPBottleneck(bc * 16, bc * 16),
                                   CSPLayer(bc * 16, bc * 16, bd, shortcut=False))

    def forward(self, x):
        x = self.dark2(self.stem(x))
        d3 = self.dark3(x)
        d4 = self.dark4(d3)
        return d3, d4, self.dark5(d4)


class YOLOPAFPN(nn.Module):
    def __init__(self, depth=0.33, width=0.25, in_channels=(256, 512, 1024)):
        super().__init__()
        c0, c1, c2 = (int(c * width) for c in in_channels)
        n = round(3 * depth)
        self.backbone = CSPDarknet(depth, width)
        self.upsample = nn.Upsample(scale_factor=2, mode="nearest")
        self.lateral_conv0 = BaseConv(c2, c1, 1, 1)
        self.C3_p4 = CSPLayer(2 * c1, c1, n, False)
        self.reduce_conv1 = BaseConv(c1, c0, 1, 1)
        self.C3_p3 = CSPLayer(2 * c0, c0, n, False)
        self.bu_conv2 = DWConv(c0, c0, 3, 2)
        self.C3_n3 = CSPLayer(2 * c0, c1, n, False)
        self.bu_conv1 = DWConv(c1, c1, 3, 2)
        self.C3_n4 = CSPLayer(2 * c1, c2, n, False)

    def forward(self, x):
        x2, x1, x0 = self.backbone(x)
        fpn_out0 = self.lateral_conv0(x0)
        f_out0 = self.C3_p4(torch.cat([self.upsample(fpn_out0), x1], 1))
        fpn_out1 = self.reduce_conv1(f_out0)
        pan_out2 = self.C3_p3(torch.cat([self.upsample(fpn_out1), x2], 1))
        pan_out1 = self.C3_n3(torch.cat([self.bu_conv2(pan_out2), fpn_out1], 1))
        pan_out0 = self.C3_n4(torch.cat([self.bu_conv1(pan_out1), fpn_out0], 1))
        return pan_out2, pan_out1, pan_out0


class YOLOXHead(nn.Module):
    """Decoupled head; eval output is raw [B, N, 5+nc] (decode_in_inference=False)."""

    def __init__(self, num_classes=80, width=0.25, in_channels=(256, 512, 1024), strides=(8, 16, 32)):
        super().__init__()
        hid = int(256 * width)
        self.strides = strides
        self.stems = nn.ModuleList(BaseConv(int(c * width), hid, 1, 1) for c in in_channels)
        self.cls_convs = nn.ModuleList(nn.Sequential(DWConv(hid, hid, 3), DWConv(hid, hid, 3)) for _ in in_channels)
        self.reg_convs = nn.ModuleList(nn.Sequential(DWConv(hid, hid, 3), DWConv(hid, hid, 3)) for _ in in_channels)
        self.cls_preds = nn.ModuleList(nn.Conv2d(hid, num_classes, 1) for _ in in_channels)
        self.reg_preds = nn.ModuleList(nn.Conv2d(hid, 4, 1) for _ in in_channels)
        self.obj_preds = nn.ModuleList(nn.Conv2d(hid, 1, 1) for _ in in_channels)

    def forward(self, xin):
        outs = []
        for k, x in enumerate(xin):
            x = self.stems[k](x)
            cls_out = self.cls_preds[k](self.cls_convs[k](x))
            reg_feat = self.reg_convs[k](x)
            reg_out, obj_out = self.reg_preds[k](reg_feat), self.obj_preds[k](reg_feat)
            if self.training:
                outs.append(torch.cat([reg_out, obj_out, cls_out], 1))
            else:
                outs.append(torch.cat([reg_out, obj_out.sigmoid(), cls_out.sigmoid()], 1))
        return torch.cat([o.flatten(start_dim=2) for o in outs], dim=2).permute(0, 2, 1)


class YOLOX(nn.Module):
    def __init__(self, num_classes=80, depth=0.33, width=0.25):
        super().__init__()
        self.backbone = YOLOPAFPN(depth, width)
        self.head = YOLOXHead(num_classes, width)

    def forward(self, x):
        return self.head(self.backbone(x))


def yolox_nano(num_classes: int = 80) -> YOLOX:
    """YOLOX-Nano: depth 0.33, width 0.25, depthwise convs."""
    return YOLOX(num_classes, 0.33, 0.25)


def export_onnx(model: YOLOX, path: str, imgsz, batch: int = 1, opset: int = 11, dynamic: bool = False) -> None:
    """Export like YOLOX's tools/export_onnx.py: input 'images', output 'output', batch-only dynamic axes."""
    model.eval()
    dummy = torch.zeros(batch, 3, *imgsz)
    torch.onnx.export(model, dummy, path, input_names=["images"], output_names=["output"], opset_version=opset,
                      dynamic_axes={"images": {0: "batch"}, "output": {0: "batch"}} if dynamic else None)
