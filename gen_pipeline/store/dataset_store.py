"""The dataset store: sharded JSONL writer with exactly-once resume by id. Sync (the pipeline calls it through
`anyio.to_thread.run_sync` in batches). The shards are the source of truth, read back under layout.py's trust rules."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, cast

import orjson

from gen_pipeline.config.dataset import fingerprint_digest
from gen_pipeline.display import display_path
from gen_pipeline.errors import DiskError, StoreError
from gen_pipeline.records import Failure, Reject, Sample
from gen_pipeline.store import layout, shards
from gen_pipeline.store import manifest as mf
from gen_pipeline.store.fingerprint import FINGERPRINT_NAME, check_rows, read_fingerprint, write_fingerprint
from gen_pipeline.store.layout import ShardFile
from gen_pipeline.store.lock import FolderGone, RunLock
from gen_pipeline.store.ranks import RankSpec
from gen_pipeline.store.shards import ShardScan

# How often lock() makes the folder again when runs giving up keep removing it (each removes it once).
_FOLDER_RETRIES = 20


def default_opener(path: Path, mode: str) -> BinaryIO:
    return cast(BinaryIO, open(path, mode))  # the store opens its files in binary modes only


@dataclass
class ResumeState:
    """What open() found: ids to skip and what it had to repair."""

    done_ids: set[str]
    done: int
    repaired_bytes: int
    notes: list[str]


class DatasetStore:
    """Writer of `root/dataset` (a rank: its rank-<R>-of-<W>/ part, to its share of `target`); `with` after open()."""

    def __init__(self, root: Path, dataset: str, *, fingerprint: dict[str, Any], target: int,
                 shard_max_samples: int = 2000, fsync_every: int = 64,
                 file_opener: Callable[[Path, str], BinaryIO] = default_opener, rank: RankSpec = RankSpec()):
        self.rank = rank
        self.folder, self._dataset_dir = layout.part_folder(root, dataset, rank), layout.dataset_folder(root, dataset)
        self.dataset, self.fingerprint, self.target = dataset, fingerprint, rank.share(target)
        self.shard_max_samples, self.fsync_every, self._opener = shard_max_samples, fsync_every, file_opener
        self.done_ids: set[str] = set()
        self._lock: RunLock | None = None
        self._files: dict[str, BinaryIO] = {}
        self._sizes: dict[str, int] = {}  # bytes known good per file name (flushed, whole lines)
        self._manifest: mf.Manifest = {}
        self._sealed: list[mf.ShardRecord] = []
        self._open = ShardScan()
        self._open_index = self._unsynced = self._repaired = 0
        self._run: mf.RunRecord | None = None  # this run's record, from begin() on
        self._notes: list[str] = []
        self._created: list[Path] = []  # the folders claim() made, innermost first
        self._rejected_rows: set[int] = set()  # source rows already in rejects.jsonl
        # _scanned: claim() got to its end; _loaded: done_ids holds every shard's ids (open() got past _load_shards)
        self._failed = self._closed = self._scanned = self._loaded = False

    @property
    def done(self) -> int:
        return len(self.done_ids)

    @property
    def claimed(self) -> bool:
        """claim() succeeded and the store is not closed yet (it holds the lock)."""
        return self._scanned and not self._closed

    @property
    def remaining(self) -> int:
        return max(0, self.target - self.done)

    def record_stop(self, stopped_by: str) -> None:
        """Why this run ended (RunSummary.stopped_by); written into its manifest record at close()."""
        self._record()["stopped_by"] = stopped_by

    def record_server(self, *, tp_size: Any, dp_size: Any, servers: int, gpus: int | None, how: str) -> None:
        """The server this run uses: tp/dp as it reported them (kept when whole numbers), how many servers,
        the GPUs held (server/handle.py server_gpus; None = unknown); written at the next commit."""
        run = self._record()
        if _positive_int(tp_size):
            run["tp_size"] = tp_size
        if _positive_int(dp_size):
            run["dp_size"] = dp_size
        run["servers"], run["gpus_how"] = servers, how
        if gpus is not None:
            run["gpus"] = gpus

    def record_generating(self) -> None:
        """Its dataset sends its first request now (the start of its GPU time)."""
        self._record().setdefault("generating_at", mf.now_iso())

    @property
    def run_number(self) -> int | None:
        """This run's number in the manifest's runs (1, 2, ...); None before begin()."""
        return self._run["run"] if self._run is not None else None

    def _record(self) -> mf.RunRecord:
        if self._run is None:
            raise StoreError(f"The store for {display_path(self.folder)} has no run: call begin() first.")
        return self._run

    def final_failure_ids(self) -> set[str]:
        """Ids whose failure a retry cannot fix (`retryable: false` in errors.jsonl) and not done."""
        return layout.final_failure_ids(self.folder) - self.done_ids

    def open(self) -> ResumeState:
        """claim(), then begin() (records this run); raises StoreError, LockedError, ConfigDriftError."""
        state = self.claim()
        try:
            self.begin()
        except BaseException:
            self.release()
            raise
        return state

    def claim(self) -> ResumeState:
        """Lock the folder (unless lock() did), check drift, repair and scan. Nothing of this run is written
        yet: a launch refused now `release()`s the claim and leaves no trace. Raises as open()."""
        self.lock()
        assert self._lock is not None
        try:
            layout.check_world(self._dataset_dir, self.rank)  # again, now that our folder and lock exist
            return self._scan_locked(self._lock.note)
        except BaseException:
            self.release()
            raise

    def lock(self) -> None:
        """Make the folder and take its lock (idempotent; a job takes all first, in one order: run/setup.py); a folder
        a refused run removes between our mkdir and our lock's create is made again. Raises LockedError, StoreError."""
        if self._lock is not None:
            return
        layout.check_world(self._dataset_dir, self.rank)  # before creating anything
        for _ in range(_FOLDER_RETRIES):
            self._created = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"Cannot create {display_path(self.folder)}: {e.strerror or e}. "
                                 "Fix the path's permissions or choose another output folder.") from None
            try:
                self._lock = RunLock.acquire(self.folder)
                return
            except FolderGone as e:
                gone = e
        raise gone

    def _scan_locked(self, lock_note: str | None) -> ResumeState:
        notes = self._notes = [lock_note] if lock_note else []
        if mf.remove_stale_tmp(self.folder):
            notes.append("removed a manifest tmp file left by a crash (the manifest itself is intact)")
        if shards.remove_tmp_files(self.folder):
            notes.append("removed tmp files of a rewrite a crash interrupted (the files themselves are intact)")
        manifest, why = mf.read_manifest(self.folder)
        if why:
            notes.append(why)
        # the config that wrote this folder: the manifest's, else fingerprint.json's (None: neither)
        stored = manifest["fingerprint"] if manifest and "fingerprint" in manifest else read_fingerprint(self.folder)
        if stored is not None and stored != self.fingerprint:
            # Drift only matters once samples exist: a first run that died on a config or source
            # error must not lock its mistake in.
            if layout.has_samples(self.folder):
                mf.check_drift(self.folder, stored, self.fingerprint)
            notes.append("the config changed before any sample was written; the new one is recorded")
        if self.rank.ranked:  # every rank of a dataset writes with one config
            layout.check_other_ranks(self.folder.parent, self.rank, self.fingerprint)
        self._manifest = manifest or {"created_at": mf.now_iso(), "runs": []}
        configs: list[tuple[str, bytes, int]] = []
        self._repaired = self._load_shards(notes, configs)
        if stored is None:  # manifest and fingerprint.json both lost: the rows say which config made them
            check_rows(self.folder, configs, self.fingerprint)
        for name in (layout.ERRORS_NAME, layout.REJECTS_NAME):
            self._repaired += self._cut_torn_tail(self.folder / name, notes)
        self._rejected_rows = layout.rejected_rows(self.folder)
        self._scanned = True
        return ResumeState(set(self.done_ids), self.done, self._repaired, notes)

    def begin(self) -> None:
        """Record this run in the manifest (committed) and open the shard it appends to; raises DiskError."""
        if self._lock is None or self._closed or self._run is not None:
            raise StoreError(f"The store for {display_path(self.folder)} is not claimed (or already begun).")
        self._io(self.folder / FINGERPRINT_NAME, write_fingerprint, self.folder, self.fingerprint)
        runs = self._manifest.setdefault("runs", [])
        self._run = {"run": len(runs) + 1, "pid": os.getpid(), "host": socket.gethostname(),
                     "started_at": mf.now_iso(), "ended_at": None, "done_at_start": self.done,
                     "samples_written": 0, "duplicates_skipped": 0, "over_target_skipped": 0,
                     "failures": 0, "rejects": 0, "repaired_bytes": self._repaired, "notes": self._notes}
        runs.append(self._run)
        self._start_shard()
        if self._open.samples >= self.shard_max_samples:  # crashed between sealing and the manifest
            self._rotate()
        self.commit()

    def release(self) -> None:
        """Give up a claim without recording a run (idempotent): unlock, remove the folders claim() made if empty."""
        if self._closed or self._lock is None:
            return
        self._closed = True
        self._close_files()
        self._lock.release()
        for made in self._created:  # only while still empty: leave no folder of a refused run
            try:
                made.rmdir()
            except OSError:
                break

    def _cut_torn_tail(self, path: Path, notes: list[str]) -> int:
        """Cut a torn last line of errors.jsonl / rejects.jsonl so the next append starts a line."""
        data = path.read_bytes() if path.exists() else b""
        if cut := len(data) - (data.rfind(b"\n") + 1):
            self._io(path, os.truncate, path, len(data) - cut)
            notes.append(f"cut {cut} bytes (a torn last line) from {path.name}")
        return cut

    def _load_shards(self, notes: list[str], configs: list[tuple[str, bytes, int]]) -> int:
        """Rebuild sealed list, open shard and done ids from the files; returns bytes cut. Duplicate ids
        on disk are removed (the later lines); `configs` gets the row configs of every shard parsed."""
        files = layout.shard_files(self.folder, self._manifest)
        present = {sh.path.name for sh in files}
        for name, e in layout.sealed_records(self._manifest).items():
            if name not in present:
                notes.append(f"{name} is listed in the manifest but missing: its {e.get('samples', '?')} "
                             "samples will be generated again")
        # the last shard is the open one unless the manifest lists it as sealed
        self._open_index = files[-1].index + (files[-1].listed_record is not None) if files else 0
        repaired = 0
        ids_of: dict[str, list[str]] = {}  # shard name: its ids, to say where a duplicate's first line is
        for shard in files:
            is_open = shard.index == self._open_index
            entry, scan = (None, self._load_open(shard, notes)) if is_open else self._load_sealed(shard, notes)
            repaired += scan.cut_bytes
            configs += [(shard.path.name, key, line) for key, line in scan.configs.items()]
            if len(set(scan.ids)) != len(scan.ids) or not self.done_ids.isdisjoint(scan.ids):
                scan = self._drop_duplicates(shard, scan, ids_of, notes)
                entry = scan.entry(shard.path.name)
            self.done_ids.update(scan.ids)
            ids_of[shard.path.name] = scan.ids
            if is_open:
                self._open = scan
            elif entry is not None:
                self._sealed.append(entry)
        self._loaded = True
        return repaired

    def _load_open(self, shard: ShardFile, notes: list[str]) -> ShardScan:
        scan = self._repair(shard.path, notes)
        committed = self._manifest.get("open")  # read_manifest checked its types
        if committed is not None and committed["name"] == shard.path.name and scan.good_bytes < (
                length := committed["committed_bytes"]):
            notes.append(f"{shard.path.name} is shorter than its committed length ({scan.good_bytes} < {length} "
                         "bytes): the disk lost fsynced data; the lost samples will be generated again")
        return scan

    def _drop_duplicates(self, shard: ShardFile, scan: ShardScan, ids_of: dict[str, list[str]],
                         notes: list[str]) -> ShardScan:
        """Rewrite `shard` without the lines whose id is done already (or met earlier in it): tmp file,
        fsync, rename; a sealed shard's sidecar too. The manifest records the new figures at the next commit."""
        data = self._io(shard.path, shard.path.read_bytes)
        kept: list[bytes] = []
        keep_ids: set[str] = set()
        firsts: set[str] = set()
        start = 0
        for _line, row, _why, end in shards.iter_lines(data):
            rid = row["id"] if row is not None else ""  # "": damage in a trusted shard, kept for validate to show
            if rid in self.done_ids:
                firsts.add(next(name for name, ids in ids_of.items() if rid in ids))
            elif rid and rid in keep_ids:
                firsts.add(shard.path.name)
            else:
                kept.append(data[start:end])
                keep_ids.add(rid)
            start = end
        body = b"".join(kept)
        self._io(shard.path, shards.write_atomic, shard.path, body)
        new = shards.scan_bytes(body)
        if shard.index != self._open_index:
            self._io(shard.path, shards.write_sidecar, shard.path, new.ids, new.good_bytes)
        n = scan.samples - new.samples
        notes.append(f"removed {n} duplicate line{'s' if n != 1 else ''} from {shard.path.name} (ids already "
                     f"written in {', '.join(sorted(firsts))}; kept the first line of each)")
        return new

    def _load_sealed(self, shard: ShardFile, notes: list[str]) -> tuple[mf.ShardRecord, ShardScan]:
        """A sealed shard's record and scan: manifest's and sidecar's when trusted, else parsed (sidecar rewritten)."""
        if shard.record is not None:
            found = layout.committed_shard(shard)
            if not found.parsed:
                self._check_sealed_ids(shard.path, found.scan.ids)
                return shard.record, found.scan
            why = "its id sidecar is missing or does not match"
        elif shard.listed_record is not None:
            why = f"its size ({shard.size} bytes) differs from the manifest's ({shard.listed_record['bytes']})"
        else:
            why = "it is not in the manifest"
        notes.append(f"re-scanned {shard.path.name}: {why}")
        scan = self._repair(shard.path, notes)
        self._io(shard.path, shards.write_sidecar, shard.path, scan.ids, scan.good_bytes)
        return scan.entry(shard.path.name), scan

    def _check_sealed_ids(self, path: Path, ids: list[str]) -> None:
        """Raise StoreError (naming the line) when a sealed shard's lines no longer carry the ids its sidecar recorded:
        a bit flip inside an id keeps the size (the record is trusted): a line may name a sample it does not hold."""
        data = self._io(path, path.read_bytes)
        if (number := shards.first_changed_line(data, ids)) is None:
            return
        row, _why = shards.parse_line(data.split(b"\n")[number - 1] if number <= data.count(b"\n") else b"")
        seen = f"id {orjson.dumps(row['id']).decode()}" if row is not None else "no readable id"
        recorded = f"id {orjson.dumps(ids[number - 1]).decode()}" if number <= len(ids) else "no line there"
        raise StoreError(
            f"{display_path(path)} line {number} has {seen}, but the shard's id sidecar "
            f"{shards.sidecar_path(path).name} recorded {recorded} when the shard was sealed: the file changed on "
            "disk since (a bit flip or an edit), so that line may hold another sample than its id says. Delete that "
            "line (its sample will be generated again) or restore the file, then run again; `gen-pipeline validate` "
            "lists what else is damaged.")

    def _repair(self, path: Path, notes: list[str]) -> ShardScan:
        """Parse a shard and cut a torn or invalid last line; raises StoreError on mid-file corruption."""
        scan = shards.scan_bytes(path.read_bytes())
        if scan.corrupt:
            line, why = scan.corrupt[0]
            raise StoreError(
                f"{display_path(path)} line {line} is {why}, and it is not the last line, so this is not "
                "a torn write: the file is damaged. Fix or delete that line (its sample will be generated "
                "again), or move the file away, then run again.")
        if scan.cut_bytes:
            self._io(path, os.truncate, path, scan.good_bytes)
            notes.append(f"cut {scan.cut_bytes} bytes (a torn or invalid last line) from {path.name}")
        return scan

    def _start_shard(self) -> None:
        name = shards.shard_name(self._open_index)
        self._sizes[name] = self._open.good_bytes
        self._files[name] = self._io(self.folder / name, self._opener, self.folder / name, "ab")

    def write_samples(self, samples: Sequence[Sample]) -> int:
        """Append new samples (flushed), skipping done ids and any past the target; returns how many; DiskError."""
        batch, run = self._admit(samples), self._record()
        start = 0
        while start < len(batch):
            chunk = batch[start:start + self.shard_max_samples - self._open.samples]
            name = shards.shard_name(self._open_index)
            self._append(name, b"".join(s.to_json() for s in chunk))
            for s in chunk:
                self._open.add({"id": s.id, "meta": s.meta})
            self.done_ids.update(s.id for s in chunk)
            self._open.good_bytes = self._sizes[name]
            self._unsynced += len(chunk)
            run["samples_written"] = run.get("samples_written", 0) + len(chunk)
            start += len(chunk)
            if self._open.samples >= self.shard_max_samples:
                self._rotate()
        if self._unsynced >= self.fsync_every:
            self.commit()
        return len(batch)

    def _admit(self, samples: Sequence[Sample]) -> list[Sample]:
        run = self._check_usable()
        batch: list[Sample] = []
        seen: set[str] = set()
        for s in samples:
            if s.id in self.done_ids or s.id in seen:
                run["duplicates_skipped"] = run.get("duplicates_skipped", 0) + 1
            elif self.done + len(batch) >= self.target:
                run["over_target_skipped"] = run.get("over_target_skipped", 0) + 1
            else:
                batch.append(s)
                seen.add(s.id)
        return batch

    def write_failures(self, failures: Sequence[Failure]) -> None:
        """Append Failure lines (with this run's number) to errors.jsonl; raises DiskError."""
        self._append_records(layout.ERRORS_NAME, "failures", failures)

    def write_rejects(self, rejects: Sequence[Reject]) -> None:
        """Append Reject lines (with this run's number) to rejects.jsonl, each source row once
        across runs (every run re-reads the source and meets the same bad rows); raises DiskError."""
        self._check_usable()
        rejects = [r for r in rejects if r.source_index not in self._rejected_rows]
        self._rejected_rows.update(r.source_index for r in rejects)
        self._append_records(layout.REJECTS_NAME, "rejects", rejects)

    def _append_records(self, name: str, count: Literal["failures", "rejects"],
                        records: Sequence[Failure | Reject]) -> None:
        run = self._check_usable()
        if records:
            self._append(name, b"".join(orjson.dumps({**orjson.loads(r.to_json()), "run": run["run"]},
                                                     option=orjson.OPT_APPEND_NEWLINE) for r in records))
            run[count] = run.get(count, 0) + len(records)

    def _append(self, name: str, blob: bytes) -> None:
        """Write + flush one blob of whole lines; on failure cut the file back and raise DiskError."""
        path = self.folder / name
        if name not in self._files:
            self._sizes[name] = path.stat().st_size if path.exists() else 0
            self._files[name] = self._io(path, self._opener, path, "ab")
        try:
            self._files[name].write(blob)
            self._files[name].flush()
        except OSError as e:
            self._fail(path, e, self._sizes[name])
        self._sizes[name] += len(blob)

    def _rotate(self) -> None:
        """Seal the open shard (fsync, sidecar, manifest record) and start the next one."""
        name = shards.shard_name(self._open_index)
        path = self.folder / name
        self._sync(name)
        with contextlib.suppress(OSError):  # flushed and fsynced above: nothing left to lose
            self._files.pop(name).close()
        self._io(path, shards.write_sidecar, path, self._open.ids, self._sizes[name])
        self._sealed.append(self._open.entry(name))
        self._open_index += 1
        self._open = ShardScan()
        self._start_shard()
        self.commit()

    def commit(self, progress: mf.ProgressRecord | None = None) -> None:
        """fsync the files, then replace the manifest atomically (with the live figures if given); raises DiskError."""
        run = self._check_usable()
        for name in list(self._files):
            self._sync(name)
        self._unsynced = 0
        run["updated_at"] = mf.now_iso()
        open_record: mf.OpenShardRecord = {"name": shards.shard_name(self._open_index),
                                        "committed_bytes": self._open.good_bytes,
                                        "committed_samples": self._open.samples, **self._open.figures()}
        self._manifest.update({
            "dataset": self.dataset, "target": self.target, "fingerprint": self.fingerprint,
            "fingerprint_digest": fingerprint_digest(self.fingerprint), "sealed": self._sealed,
            "open": open_record, "updated_at": run["updated_at"]})
        if self.rank.ranked:  # status reads the rank from here (and the folder name)
            self._manifest.update({"rank": self.rank.rank, "world_size": self.rank.world})
        if progress is not None:  # a later commit without figures keeps these
            self._manifest["progress"] = progress
        self._io(self.folder / mf.MANIFEST_NAME, mf.write_manifest, self.folder, self._manifest)

    def _sync(self, name: str) -> None:
        f = self._files[name]
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            self._fail(self.folder / name, e, self._sizes[name])

    def close(self, progress: mf.ProgressRecord | None = None) -> None:
        """Commit (unless a write failed or no run began), then release() (a begun run's folder is not empty)."""
        if self._closed or self._lock is None:
            return
        try:
            if self._run is not None and not self._failed:
                self._run["ended_at"] = mf.now_iso()
                self.commit(progress)
        finally:
            self.release()

    def __enter__(self) -> DatasetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_usable(self) -> mf.RunRecord:
        """This run's record; StoreError when the store is not open (or has not begun) or a write failed."""
        if self._lock is None or self._closed or self._run is None:
            raise StoreError(f"The store for {display_path(self.folder)} is not open.")
        if self._failed:
            raise StoreError(f"The store for {display_path(self.folder)} stopped after a failed write; "
                             "run the same command again to resume.")
        return self._run

    def _io(self, path: Path, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except OSError as e:
            self._fail(path, e, None)

    def _fail(self, path: Path, exc: OSError, good_bytes: int | None) -> None:
        """Stop the store: close its files, cut `path` back to whole lines, raise DiskError."""
        self._failed = True
        handle = self._files.pop(path.name, None)
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()  # may try to flush the same bytes again and fail again
        if good_bytes is not None:
            with contextlib.suppress(OSError):
                os.truncate(path, good_bytes)
        hint = ("free space and run the same command to resume" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
                else "check the disk and run the same command to resume")
        raise DiskError(f"Writing {display_path(path)} failed: {exc.strerror or exc}. {self._committed()} samples "
                        f"are committed and safe; {hint}.") from exc

    def _committed(self) -> int:
        """Samples on disk: done, or while open() still loads (a repair write failed), counted from the files."""
        if self._loaded:
            return self.done
        with contextlib.suppress(OSError):
            return sum(c.samples for c in layout.committed_shards(self.folder, ids=False))
        return self.done

    def _close_files(self) -> None:
        for f in self._files.values():
            with contextlib.suppress(OSError):
                f.close()
        self._files.clear()


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0
