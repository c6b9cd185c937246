"""The model store on disk: ROOT/<name>/<file>.gguf with ROOT/<name>/manifest.json, and downloads in progress
under ROOT/.partial (never listed, never served). A model appears only when its manifest is written, last and
atomically, after the file is complete, hashed and read as a GGUF."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path

from host_runtime.common import settings_file
from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.download import file_sha256
from host_runtime.common.service_user import give_to_services
from host_runtime.common.settings_file import SettingsError
from host_runtime.models.errors import StoreError
from host_runtime.models.gguf_info import check_part, read_info
from host_runtime.models.manifest import Manifest, check_name
from host_runtime.models.model_settings import FILE, ModelSettings
from host_runtime.placement.gguf_split import store_names

MANIFEST = "manifest.json"
PARTIAL = ".partial"
VERIFIED = ".verified"  # the model file's size and mtime when its sha256 last matched (Store.verify)
FREE_SPACE_RESERVE = 1 << 30  # the data partition keeps this free: logs, the prefix cache, updates


def default_root() -> Path:
    """$EVERYCYCLE_MODEL_STORE (make run sets ./var/models), else the box's data partition."""
    return Path(os.environ.get("EVERYCYCLE_MODEL_STORE", "/var/lib/everycycle/models"))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class Store:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else default_root()

    # ---- reading -------------------------------------------------------------------------------------------

    def list(self) -> list[Manifest]:
        out = []
        if not self.root.is_dir():
            return out
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not (entry / MANIFEST).is_file():
                continue
            try:
                out.append(self._trusted(entry.name, Manifest.from_json((entry / MANIFEST).read_text())))
            except (StoreError, OSError):
                continue  # a damaged or foreign manifest hides its model; `models show` says why
        return out

    def get(self, name: str) -> Manifest:
        path = self.root / check_name(name, "NAME") / MANIFEST
        try:
            return self._trusted(name, Manifest.from_json(path.read_text()))
        except FileNotFoundError:
            have = ", ".join(m.name for m in self.list()) or "none"
            raise StoreError(f"no model named {name!r} in {self.root} (the store has: {have})") from None
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror}") from None

    def _trusted(self, folder: str, manifest: Manifest) -> Manifest:
        """A manifest names its own folder and a file inside it, or it is not the store's: the serving user can
        write one, and root acts on what it says (a planted name "../x" took `models rm` outside the store, #56)."""
        files = [file for file, _, _ in manifest.files()]
        if manifest.name != folder or not all(file and Path(file).name == file and file not in (".", "..")
                                              for file in files):
            raise StoreError(f"{self.root / folder / MANIFEST} names {manifest.name!r} with file {manifest.file!r}, "
                             f"not its own folder {folder!r} and a file in it: not trusted; look at that folder and "
                             "remove it by hand")
        return manifest

    def path_of(self, manifest: Manifest) -> Path:
        return self.root / manifest.name / manifest.file

    def file_for(self, name: str) -> Path:
        """Where a model of this name keeps its GGUF (admit puts it there, and its manifest then names it)."""
        return self.root / name / store_names(name, 1)[0]

    # ---- writing -------------------------------------------------------------------------------------------

    def partial_dir(self) -> Path:
        d = self.root / PARTIAL
        if not d.is_dir():
            d.mkdir(parents=True, exist_ok=True)
            # Made by root's CLI, it must stay usable by the serving service's first-boot pull.
            give_to_services(d)
        return d

    def check_room(self, size: int | None, name: str) -> None:
        """Refuse, before a byte is written, a model the disk cannot hold (keeping the reserve)."""
        if size is None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.root).free
        if size + FREE_SPACE_RESERVE > free:
            raise StoreError(f"{name} is {size / 2**30:.2f} GiB; {self.root} has {free / 2**30:.2f} GiB free and "
                             f"keeps {FREE_SPACE_RESERVE >> 30} GiB spare: free some space (everycycle models rm)")

    def room(self) -> int:
        """The bytes a download may still write here, keeping the reserve."""
        self.root.mkdir(parents=True, exist_ok=True)
        return max(0, shutil.disk_usage(self.root).free - FREE_SPACE_RESERVE)

    def refuse_existing(self, name: str) -> None:
        if (self.root / name / MANIFEST).exists():
            raise StoreError(f"a model named {name!r} is already in the store: pick another --name, or remove it "
                             "first (everycycle models rm)")

    def admit(self, file: Path, name: str, sha256: str, source: str, *, move: bool,
              parts: tuple[tuple[Path, str], ...] = ()) -> Manifest:
        """Make a complete, hashed file a model: read it as a GGUF, put it in place, write the manifest last.
        parts: a split GGUF's further parts (file, sha256) in order, each checked to be that part, kept beside
        the first under the names llama.cpp looks for (gguf_split.store_names)."""
        check_name(name)
        self.refuse_existing(name)
        info = read_info(file)
        for number, (part, _) in enumerate(parts, start=2):
            check_part(part, number, len(parts) + 1)
        names = store_names(name, len(parts) + 1)
        target = self.root / name / names[0]
        if info["architecture"] == "whisper":  # whisper.cpp's own format, not a GGUF: named for what it is
            target = target.with_suffix(".bin")
        target.parent.mkdir(parents=True, exist_ok=True)
        placed = [(part, target.parent / each) for (part, _), each in zip(parts, names[1:])]
        for source_file, dest in [(file, target), *placed]:
            if move:
                os.replace(source_file, dest)
            else:
                staged = dest.with_name(dest.name + ".partial")
                _copy_without_links(source_file, staged)
                os.replace(staged, dest)
        more = tuple({"file": dest.name, "sha256": digest, "size": dest.stat().st_size}
                     for (_, dest), (_, digest) in zip(placed, parts))
        manifest = Manifest(name=name, file=target.name, sha256=sha256,
                            size=target.stat().st_size + sum(p["size"] for p in more), source=source,
                            added_at=_now(), parts=more, **info)
        atomic_write(target.parent / MANIFEST, manifest.to_json().encode(), mode=0o644)
        self._stamp(manifest)  # hashed just now: verify() need not hash it again
        return manifest

    def copy(self, source: str, name: str) -> Manifest:
        """The model `source` under a second name (Ollama's copy): the same file, hard-linked where the folder's
        file system allows (a copy of its bytes otherwise), its manifest and own settings, the manifest last."""
        check_name(name)
        self.refuse_existing(name)
        manifest = self.get(source)
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        for file, _, _ in manifest.files():  # a split GGUF's parts keep their names: llama.cpp finds them so
            original, target = self.root / source / file, folder / file
            target.unlink(missing_ok=True)
            try:
                os.link(original, target, follow_symlinks=False)
            except OSError:
                staged = target.with_name(target.name + ".partial")
                _copy_without_links(original, staged)
                os.replace(staged, target)
        target = folder / manifest.file
        settings = self.root / source / FILE
        if settings.is_file():
            atomic_write(target.parent / FILE, settings.read_bytes(), mode=0o644)
        copied = Manifest(**{**manifest.__dict__, "name": name, "source": f"copy of {source}", "added_at": _now(),
                             "pinned": False})
        atomic_write(target.parent / MANIFEST, copied.to_json().encode(), mode=0o644)
        return copied

    # ---- checking ------------------------------------------------------------------------------------------

    def verify(self, manifest: Manifest) -> None:
        """The model's files are still the ones admitted, before an engine loads it (#55: random bytes written
        over a model's weights were served, garbage and all): their sizes every time; their sha256 again where a
        size or modification time differs from the last time they matched (VERIFIED beside the manifest).
        StoreError naming the model and what differs; nothing is changed."""
        def its(file: str) -> str:
            return f"its part {file}" if manifest.parts else "its file"

        stats = []
        for file, _, size in manifest.files():
            path = self.root / manifest.name / file
            try:
                st = path.stat()
            except OSError as exc:
                raise StoreError(f"the model '{manifest.name}' has lost its file ({path}: {exc.strerror}); add or "
                                 "pull it again") from None
            if st.st_size != size:
                raise StoreError(f"the model '{manifest.name}' is damaged: {its(file)} has {st.st_size:,} bytes "
                                 f"where its manifest says {size:,} (cut short or overwritten); remove it and add or "
                                 "pull it again (everycycle models rm, then models add|pull)")
            stats.append(st)
        try:
            if (self.root / manifest.name / VERIFIED).read_text() == _stamp_text(stats):
                return
        except OSError:
            pass  # never checked since it was admitted by an earlier version, or the stamp is unreadable: hash
        for file, digest, _ in manifest.files():
            if file_sha256(self.root / manifest.name / file).hexdigest() != digest:
                raise StoreError(f"the model '{manifest.name}' is damaged: {its(file)}'s sha256 no longer "
                                 "matches its manifest's (its bytes changed after it was added); remove it and add "
                                 "or pull it again (everycycle models rm, then models add|pull)")
        self._stamp(manifest)

    def _stamp(self, manifest: Manifest) -> None:
        try:
            stats = [(self.root / manifest.name / file).stat() for file, _, _ in manifest.files()]
            atomic_write(self.root / manifest.name / VERIFIED, _stamp_text(stats).encode(), mode=0o644)
        except OSError:
            pass  # a store this process may not write: the next load hashes again, nothing worse

    def attach_projector(self, name: str, file: Path) -> Manifest:
        """A vision projector (a clip GGUF, llama-server's --mmproj) kept beside the model and served with it
        wherever it is loaded. The file first, the manifest last: a model is never left naming a missing file."""
        takes = check_projector(file)
        manifest = self.get(name)
        target = self.root / name / PROJECTOR_FILE
        staged = target.with_name(target.name + ".partial")
        _copy_without_links(file, staged)
        os.replace(staged, target)
        updated = Manifest(**{**manifest.__dict__, "projector": PROJECTOR_FILE, "projector_takes": takes})
        atomic_write(self.root / name / MANIFEST, updated.to_json().encode(), mode=0o644)
        return updated

    def projector_of(self, path: str | Path) -> str | None:
        """The projector of the store model whose file `path` is; None for one without, or a file outside."""
        name = self.name_of_path(path)
        manifest = self.get(name) if name else None
        return str(self.root / name / manifest.projector) if manifest and manifest.projector else None

    def remove(self, name: str) -> Manifest:
        manifest = self.get(name)  # trusted: it names this folder
        directory = self.root / check_name(name, "NAME")
        # The manifest goes first: from that instant the model is not in the store, whatever is left.
        (directory / MANIFEST).unlink()
        shutil.rmtree(directory, ignore_errors=True)
        return manifest

    def settings_of(self, name: str):
        """The model's own serving settings (model_settings.py); the empty ones where it has none."""
        path = self.root / check_name(name, "NAME") / FILE
        try:
            return settings_file.load(ModelSettings, path)
        except SettingsError as exc:
            raise StoreError(f"{path}: {exc}") from None

    def set_settings(self, name: str, settings) -> None:
        """Writes the model's own settings (atomically), or removes them when all are empty."""
        self.get(name)
        path = self.root / name / FILE
        if settings == ModelSettings():
            path.unlink(missing_ok=True)
        else:
            settings_file.save(settings, path)

    def own_serve_options(self, path: str | Path) -> dict:
        """The settings the store model at `path` keeps for itself (models set), by the serve option each stands
        for; none for a file outside the store. StoreError where its settings file is unreadable."""
        name = self.name_of_path(path)
        return self.settings_of(name).serve_options() if name else {}

    def name_of_path(self, path: str | Path) -> str | None:
        """The name of the store model whose file `path` is, or None (a file outside the store)."""
        path = Path(path)
        if path.parent.parent != self.root or not (path.parent / MANIFEST).is_file():
            return None
        return path.parent.name

    def set_pinned(self, name: str, pinned: bool) -> Manifest:
        manifest = self.get(name)
        updated = Manifest(**{**json.loads(manifest.to_json()), "pinned": pinned})
        atomic_write(self.root / name / MANIFEST, updated.to_json().encode(), mode=0o644)
        return updated


PROJECTOR_FILE = "mmproj.gguf"


def check_projector(file: Path) -> str:
    """A projector: a GGUF file whose architecture is clip (libmtmd's projectors). What it takes: "vision",
    "audio" or "vision,audio", by its encoders."""
    if not file.is_file():
        raise StoreError(f"--mmproj: {file} is not a file")
    architecture = read_info(file)["architecture"]
    if architecture != "clip":
        raise StoreError(f"--mmproj: {file.name} is a {architecture} model, not a projector (a clip GGUF, often "
                         "named mmproj-*.gguf)")
    import gguf

    from host_runtime.placement.model_table import _field

    reader = gguf.GGUFReader(str(file), "r")
    takes = [kind for kind in ("vision", "audio") if _field(reader, f"clip.has_{kind}_encoder")]
    return ",".join(takes) or "vision"  # an older projector names no encoder: a vision one (LLaVA's)


def _copy_without_links(source: Path, dest: Path) -> None:
    """Copy into a directory the services own (root's `models add`): whatever is at dest (a link planted there)
    is removed, never followed, and the copy is a new file (O_EXCL: a link planted in between is an error)."""
    dest.unlink(missing_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(source, "rb") as src, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
        out.flush()
        os.fsync(out.fileno())


def _stamp_text(stats: list[os.stat_result]) -> str:
    """What VERIFIED holds: each file's size and modification time when its sha256 last matched its manifest."""
    return "".join(f"{st.st_size} {st.st_mtime_ns}\n" for st in stats)
