"""The image chats of the multimodal real-engine proofs (issue 35), made with Pillow.

At least 30 chats: one image per chat over 15 sizes from 16x16 to 1024x768 (odd aspect ratios,
both orientations, PNG and JPEG, before or after the text), several images in one message, and
images in earlier turns; some images served over loopback HTTP (``{server}`` in their URL),
the others as data: URLs. Every image's bytes differ, so no two chats share a cached block.
"""

from __future__ import annotations

import base64
import io
import random

from PIL import Image

# (width, height): 16x16 to 1024x768, odd aspect ratios, both orientations.
SIZES = [
    (16, 16), (64, 64), (100, 80), (300, 200), (300, 100), (1024, 768), (768, 1024), (17, 333),
    (640, 7), (255, 256), (129, 65), (512, 512), (33, 900), (200, 199), (48, 64),
]  # fmt: skip


def _image(size: tuple[int, int], fmt: str, seed: int) -> bytes:
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    for _ in range(8):  # a few random pixels: every image's bytes differ
        x, y = rng.randrange(size[0]), rng.randrange(size[1])
        image.putpixel((x, y), tuple(rng.randrange(256) for _ in range(3)))
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"quality": 85} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def _data_url(data: bytes, fmt: str) -> str:
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(data).decode()}"


class Chats:
    """The image chats of the test, their images served over HTTP too."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.chats: list[tuple[str, dict]] = []
        #: Per chat, the encoded images in prompt order.
        self.images: list[list[bytes]] = []
        current: list[bytes] = []
        seed = 0

        def part(size: tuple[int, int], fmt: str, http: bool) -> dict:
            nonlocal seed
            seed += 1
            data = _image(size, fmt, seed)
            current.append(data)
            if http:
                path = f"/img{seed}.{fmt.lower()}"
                self.files[path] = data
                url = f"{{server}}{path}"
            else:
                url = _data_url(data, fmt)
            return {"type": "image_url", "image_url": {"url": url}}

        for n, size in enumerate(SIZES):  # one image per chat, after text or first
            fmt = "JPEG" if n % 3 == 1 else "PNG"
            image = part(size, fmt, http=n % 4 == 3)
            text = {"type": "text", "text": f"Chat {n}: what is in this image?"}
            content = [text, image] if n % 2 else [image, text]
            self.chats.append((f"one {size[0]}x{size[1]} {fmt}", _chat(content)))
            self.images.append(current)
            current = []
        for n in range(8):  # several images in one message
            sizes = [SIZES[(n + k) % len(SIZES)] for k in range(2 + n % 3)]
            content = [{"type": "text", "text": f"Compare {len(sizes)} images, set {n}."}]
            for k, size in enumerate(sizes):
                content.append(part(size, "PNG" if k % 2 else "JPEG", http=n % 2 == 1))
            self.chats.append((f"{len(sizes)} images in one message", _chat(content)))
            self.images.append(current)
            current = []
        for n in range(8):  # images in earlier turns
            first = [
                {"type": "text", "text": f"Turn one of {n}."},
                part(SIZES[n], "PNG", http=n % 2 == 0),
            ]
            third = [
                {"type": "text", "text": "And now this one?"},
                part(SIZES[-1 - n], "JPEG", http=False),
            ]
            self.chats.append((f"earlier turns {n}", _chat(first, f"An answer {n}.", third)))
            self.images.append(current)
            current = []

    def resolved(self, url: str) -> list[tuple[str, dict]]:
        """The chats with their HTTP images at ``url`` (the loopback server's)."""
        out = []
        for label, chat in self.chats:
            messages = []
            for message in chat["messages"]:
                content = message["content"]
                if isinstance(content, list):
                    content = [
                        {**p, "image_url": {"url": p["image_url"]["url"].format(server=url)}}
                        if p.get("type") == "image_url"
                        else p
                        for p in content
                    ]
                messages.append({**message, "content": content})
            out.append((label, {**chat, "messages": messages}))
        return out


def _chat(*turns) -> dict:
    roles = ("user", "assistant")
    return {
        "messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(turns)],
        "add_generation_prompt": True,
    }
