"""``loader.torch``: a loader daemon or config where a torch training script would use a ``DataLoader``.

::

    from loader.torch import DataLoader

    data = DataLoader("tcp://HOST:5555", device="cuda")  # or DataLoader("train.toml"): an in-process Loader
    if checkpoint is not None:  # resuming: the interrupted epoch goes on after its last batch
        data.load_state_dict(checkpoint["data"])
    for epoch in range(checkpoint["epoch"] if checkpoint else 0, epochs):
        data.set_epoch(epoch)
        for batch in data:  # {"image": tensor[64, ...], "label": tensor[64]} on the device
            ...
            checkpoint = {"model": ..., "optimizer": ..., "epoch": epoch, "data": data.state_dict()}

Iterating it runs one epoch, as iterating ``torch.utils.data.DataLoader`` does, one iteration at a time: an
iteration takes its epoch at its first batch; a later ``iter()`` (or ``load_state_dict``, ``close``) ends
the one before, whose next ``next()`` raises ``ClosedError`` (torch runs iterations side by side;
``zip(data, data)`` fails here), and an ``iter()`` that took no batch runs no epoch (Lightning makes one to
check the dataloader). ``sampler.set_epoch`` is ``set_epoch``, where Lightning calls it. ``state_dict`` and
``load_state_dict`` follow torchdata's ``StatefulDataLoader`` (``StatefulDataLoader`` below is the same
class), so Lightning, torchtitan and ``torch.distributed.checkpoint`` save and restore it as they do
that one: the state is taken at the last batch the loop took, and after ``load_state_dict`` the next
iteration continues the interrupted epoch with the batch that would have come next (a state taken
between epochs: the next epoch from its first batch). The state is a small JSON-serialisable dict; the
reader's own state (``Client.state_dict()``) is inside it, and the reader checks it on every
``load_state_dict`` (``ConfigError`` for a state of another dataset or config). Each rank has
its own: with ``torch.distributed.checkpoint``, which keeps one copy of a non-tensor value saved under
the same key by every rank, key it by rank as torchtitan does (``{f"dp_rank_{rank}": data.state_dict()}``).

torch is imported when a ``DataLoader`` is made (``loader.device.import_torch``), not by
``import loader.torch``, so the package imports without it.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import operator
import os
from collections.abc import Iterator, Mapping
from typing import Any, Protocol, cast

from loader import lightning_fit
from loader.config import LoaderConfig, load_config
from loader.config.sections import ClientConfig
from loader.device import Placer, import_torch, place_name
from loader.errors import ClosedError

STATE_KEYS = ("epoch", "resume", "reader")  # the keys of DataLoader.state_dict()

log = logging.getLogger("loader.torch")


class Reader(Protocol):
    """What ``Client`` and ``Loader`` both are: epochs of batches, and a checkpoint of where the consumer is."""

    def epoch(self, epoch: int | None = None) -> Iterator[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


Source = str | os.PathLike[str] | LoaderConfig | Reader | None


class DataLoader:
    """Batches of a loader daemon (``source`` = ``"tcp://HOST:PORT"``, ``"HOST:PORT"``, ``"ipc://PATH"``, or
    ``None`` for ``LOADER_ADDRESS``), of a config run in this process (a ``LoaderConfig`` or a TOML path:
    a ``loader.Loader``), or of a ``Client``/``Loader`` you made (used as it is, and not closed here).

    ``device``: ``"torch"``/``"cpu"``/None CPU tensors, ``"cuda"``/``"cuda:N"``/a ``torch.device`` GPU tensors; one
    without an index (``"cuda"``, ``torch.device("cuda")``) is ``cuda:LOCAL_RANK`` under torchrun, else the
    current device (``torch.cuda.set_device``), whether ``source`` is an address or a config. A field torch has
    no dtype for (strings, datetimes, long double) stays a numpy array.
    ``rank``/``world_size``/``job`` and ``client_kwargs`` go to ``Client`` (with a config, only the
    options of its ``[client]`` table). ``len()`` is the epoch's number of batches where the daemon
    knows it, else ``TypeError``. Context manager; ``close()`` is idempotent.
    """

    def __init__(
        self,
        source: Source,
        *torch_positional: Any,
        device: Any = "torch",
        dataset: str = "default",
        rank: int | None = None,
        world_size: int | None = None,
        job: str | None = None,
        **client_kwargs: Any,
    ) -> None:
        import_torch("loader.torch.DataLoader")
        _check_source(source)  # a torch Dataset given is the first thing wrong, before any torch argument
        if torch_positional:
            # DataLoader(source, 32) as torch's DataLoader(dataset, batch_size) is written: Python's own "takes 2
            # positional arguments but 3 were given" said neither what 32 was taken for nor where it belongs.
            raise TypeError(_positional_error(torch_positional))
        options = {"rank": rank, "world_size": world_size, "job": job, **client_kwargs}
        self._reader, self._owned = _open(source, device, dataset, options)
        # A Client or Loader of your own may give numpy arrays (its device "cpu"): a torch DataLoader gives
        # tensors, so those become CPU tensors here (torch.from_numpy: no copy); tensors pass as they are.
        self._tensors = Placer("torch") if self._owned is None else None
        self._next_epoch = 0  # the epoch the next iteration runs, unless it continues an interrupted one
        self._loaded: dict[str, Any] | None = None  # a mid-epoch state loaded and not iterated yet
        self._open: Iterator[Any] | None = None  # the epoch being iterated, or opened ahead by len()
        self._open_epoch = 0
        self._iterations = 0  # iter() calls: only the latest iteration reads the open epoch
        self._open_taken = 0  # batches of it the loop took
        self._open_resumed = False  # continues a loaded state's epoch
        self._steps_before: int | None = None  # of a resumed epoch: the steps its state was taken after
        self._open_done = False  # iterated to its end
        self._open_failed = False  # raised instead of a batch: not for a later iteration to take over
        self._moved_on: int | None = None  # set_epoch(n) while it was iterated: n, until a batch or iter() says why
        self._ended_at_load: int | None = None  # the epoch a state loaded between epochs was taken at the end of
        self._closed = False

    # -- what torch.utils.data.DataLoader users call --------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        """The batches of the next epoch (``set_epoch``'s, or the one after the last, or the interrupted one).

        An iteration takes its epoch at its first batch, and one that took no batch runs no epoch: the next
        ``iter()`` takes the epoch over. Lightning calls ``iter()`` once to check that a dataloader is iterable
        and drops it, then makes the epoch's iterator before calling ``set_epoch``: the first had used up
        epoch 0, so every epoch of a fit ran one ahead, and a fit resumed from an epoch-end checkpoint ran
        the epoch before again."""
        if not self._open_untouched():
            self._open_next()  # ends an iteration that took batches now, as torch drops an unfinished epoch
        self._iterations += 1
        return self._run(self._iterations)

    def __len__(self) -> int:
        """Batches in the epoch being iterated, or else in the next one (``TypeError`` where the daemon cannot count).

        The whole epoch's, after ``load_state_dict`` too, as torchdata's ``StatefulDataLoader``: a training loop
        that counts the batches taken before the state (Lightning's batch progress does) compares that count
        with ``len()``, and the rest's number would end the resumed epoch early."""
        if self._open is None or self._open_done:
            self._open_next()  # ahead: the next iter() takes this one, so len() asks for no extra epoch
        if self._open_resumed and self._steps_before is not None:
            # The steps taken before the state, at the world size that took them, and the rest at this one: a
            # state taken at world size 2 and resumed at 3 holds fewer steps than the whole epoch's count at 3
            # says, and Lightning, counting the steps taken, ended the epoch with samples left untrained.
            try:
                return self._steps_before + len(cast(Any, self._open))
            except TypeError:
                pass
        if self._open_resumed:
            whole = getattr(getattr(self._reader, "info", None), "batches", None)  # Client's and Loader's welcome
            if isinstance(whole, int):
                return whole
        return len(cast(Any, self._open))

    @property
    def batch_size(self) -> int | None:
        """Samples in each of this rank's batches (the config's ``pipeline.batch_size``; the last may be short
        unless ``drop_last``), as torch's ``DataLoader.batch_size``; None for a reader that does not say."""
        info = getattr(self._reader, "info", None)
        size = getattr(info, "batch_size", None)
        return size if isinstance(size, int) else None

    @property
    def sampler(self) -> EpochSetter:
        """What a trainer reaches for as ``dataloader.sampler.set_epoch(epoch)`` (Lightning, at each epoch's start,
        and after resuming from an epoch-end checkpoint, where it loads no state): this ``set_epoch``."""
        return EpochSetter(self)  # made each time: held here, it would tie this object into a reference cycle

    # torch's DataLoader has one; Lightning reads it beside ``sampler`` (None: batches are made by the daemon).
    batch_sampler = None

    def __getitem__(self, index: Any) -> Any:
        # torch.utils.data.DataLoader(this) takes it for a map-style Dataset: after len() it indexes it, which
        # failed inside torch with "'DataLoader' object is not subscriptable".
        raise TypeError(
            "loader.torch.DataLoader is not a Dataset but the DataLoader itself (the daemon makes its batches): "
            "iterate it, for batch in data: ..., instead of giving it to torch.utils.data.DataLoader"
        )

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run epoch ``epoch`` (as ``DistributedSampler.set_epoch``: call it before each).

        Unlike ``DistributedSampler``, iterating again without it runs the epoch after, not the same one.
        After ``load_state_dict`` of a mid-epoch state, that epoch's number continues it, so a loop that calls
        ``set_epoch(epoch)`` from the checkpoint's epoch resumes where the state was taken; the next epoch's
        starts it (dropping what was left, with a warning, unless the state was taken at its epoch's last
        batch); any other number is refused.
        Called while an iteration is under way, it is that iteration's epoch if the iteration goes on (the
        next epoch stays next), the next iteration's after a ``break``; an iteration that goes on after
        ``set_epoch`` of another epoch runs that epoch from its first batch, with a warning.
        """
        number = _epoch_number(epoch)
        resuming = self._resuming_epoch()
        if resuming is not None:
            if number == resuming:
                return
            left = self._loaded_batches_left()  # a Client's or Loader's len() of a resumed epoch: what is left
            if number == resuming + 1:
                # A state taken at its epoch's last batch (a loop that counted the epoch done): the next epoch
                # drops nothing, so it starts from its first batch. Else the loop ends its epochs early (Lightning's
                # limit_train_batches, resumed from its last step, crashed here): the rest goes, as a new
                # iteration drops an unfinished epoch, said in a warning; skipping whole epochs is refused below.
                if left != 0:
                    log.warning(_dropped_rest(resuming, number, left))
                self._close_open()
                self._reader.load_state_dict(_epoch_start(self._reader.state_dict(), number))
                self._next_epoch = number
                return
            raise ValueError(_refused_epoch(resuming, number, left))
        if self._open_untouched():  # opened ahead by len(), or by an iter() that took no batch
            if self._open_epoch == number:
                return  # for this very epoch: the next iteration takes it, the one after runs number + 1
            self._close_open()
        elif self._open_running():
            # Left by a `break`, the next iteration runs `number`; if this iteration goes on instead, ``_run``
            # settles it: the same epoch was meant (Lightning's first batch is fetched before its set_epoch);
            # another switches this iteration to it, with a warning (refused during a loaded state's epoch).
            self._moved_on = number
        self._next_epoch = number

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is: after ``load_state_dict`` of it, iteration goes on with the batch after
        the last one the loop took (torchdata's ``StatefulDataLoader.state_dict``).

        Under a Lightning fit that holds a batch taken ahead of its step (``len()`` unknown), the batch after
        the last one it trained (``loader/lightning_fit.py``)."""
        loop = lightning_fit.fit_loop_of(self)
        held = lightning_fit.batches_held(loop) if loop is not None else 0
        if held:
            state = self._state_held_back(held)
            if state is not None:
                return state
        if self._loaded is not None:
            return dict(self._loaded)  # nothing taken since it was loaded: that is still where the loop is
        if (self._open_running() and self._moved_on is None) or self._open_untouched():
            # A batch of it taken, or continuing a loaded state: the loop is inside it. Opened ahead by len(), or
            # handed out by iter() with no batch taken yet (the reader still stands where the epoch before
            # left it): it is next, from its start.
            resume = self._open_taken > 0 or self._open_resumed
            return {"epoch": self._open_epoch, "resume": resume, "reader": self._reader.state_dict()}
        return {"epoch": self._next_epoch, "resume": False, "reader": self._reader.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state`` (a ``state_dict()``): the next iteration continues its epoch, or runs the epoch
        after it when it was taken between epochs. Call it before iterating, as for ``StatefulDataLoader``.

        The reader checks the state's ``"reader"`` part either way (a state of another dataset or config is a
        ``ConfigError``). A state taken between epochs replaces any position loaded before: its epoch starts
        from the first batch."""
        epoch, resume, reader_state = _parse_state(state)
        self._close_open()
        self._ended_at_load = epoch - 1 if not resume and epoch > 0 else None
        if resume:
            self._reader.load_state_dict(dict(reader_state))  # the reader's next epoch() continues it
            self._loaded = {"epoch": epoch, "resume": True, "reader": dict(reader_state)}
        else:
            # Given to the reader too: it was not, so an earlier mid-epoch state stayed in force (the next
            # epoch silently started where that one stood), and a state of another config passed unchecked.
            self._reader.load_state_dict(_epoch_start(reader_state, epoch))
            self._loaded = None
        self._next_epoch = epoch

    def close(self) -> None:
        """Stop the epoch being iterated and close the ``Client``/``Loader`` this made. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_open()
        if self._owned is not None:
            self._owned.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def reader(self) -> Reader:
        """The ``Client`` or ``Loader`` the batches come from (``stats()``, ``status()``, ``info``)."""
        return self._reader

    # -- inside ---------------------------------------------------------------------------------------------------
    def _state_held_back(self, held: int) -> dict[str, Any] | None:
        """The state before the last ``held`` batches the loop took of the open epoch; None (with a warning)
        where it cannot be had: then ``state_dict()`` says where the loop is as without ``held``."""
        taken = self._open_taken
        if not (self._open_running() or self._open_done) or self._moved_on is not None or held > taken:
            log.warning(_cannot_hold_back(held, taken))
            return None
        epoch, resume = self._open_epoch, taken > held or self._open_resumed
        if _takes_held(self._reader):  # Client's and Loader's: a reader of your own may take it too
            reader_state = cast(Any, self._reader).state_dict(held=held)
        elif not resume:
            reader_state = self._reader.state_dict()  # moved to the epoch's start below
        else:
            log.warning(_cannot_hold_back(held, taken) + f" ({type(self._reader).__name__} takes no held=)")
            return None
        if not resume:
            return {"epoch": epoch, "resume": False, "reader": _epoch_start(reader_state, epoch)}
        return {"epoch": epoch, "resume": True, "reader": reader_state}

    def _follow_lightning(self) -> bool:
        """At an iteration's first batch under a Lightning fit, take the epoch the fit is about to give
        ``set_epoch``; True where that epoch had ended when the state loaded was taken (nothing is left of it).

        Where ``len()`` is unknown, Lightning takes an epoch's first batch before ``set_epoch``: resumed from an
        epoch-end checkpoint (it loads no state then) that batch was of epoch 0, not of the epoch it ran. And it
        cannot tell an epoch's last batch: resumed from a checkpoint of that step, it goes on with the epoch,
        whose state says the next epoch, which it would have taken for the rest of this one."""
        ended, self._ended_at_load = self._ended_at_load, None
        loop = lightning_fit.fit_loop_of(self, skip=2)
        wanted = lightning_fit.epoch_to_run(loop) if loop is not None else None
        if wanted is None:
            return False
        if wanted == ended:
            if not lightning_fit.reloads_for(loop, ended + 1):  # a new dataloader for the next epoch reads it whole
                log.warning(_resumed_at_an_epochs_end(ended))
            return True
        resuming = self._resuming_epoch()
        if resuming is not None:
            upcoming = resuming
        else:
            upcoming = self._open_epoch if self._open_untouched() else self._next_epoch
        if wanted != upcoming:
            self.set_epoch(wanted)
        return False

    def _resuming_epoch(self) -> int | None:
        if self._loaded is not None:
            return int(self._loaded["epoch"])
        if self._open_resumed and self._open_untouched():
            return self._open_epoch  # the loaded epoch, opened ahead by len() or by an iter() that took no batch
        return None

    def _loaded_batches_left(self) -> int | None:
        """Batches left of the loaded state's epoch, opened ahead as ``len()`` opens it (asking the daemon
        nothing); None where the reader cannot count them."""
        if not self._open_untouched():
            self._open_next()
        try:
            return len(cast(Any, self._open))
        except TypeError:
            return None

    def _open_next(self) -> None:
        """Open the epoch the next iteration runs; an epoch left unfinished is dropped, as DataLoader does."""
        self._close_open()
        if self._loaded is not None:
            number = int(self._loaded["epoch"])
            self._open = self._reader.epoch()  # no number: the reader continues the state it loaded
            self._steps_before = _steps_before(self._loaded.get("reader"), self.batch_size)
            self._open_resumed, self._loaded = True, None
        else:
            number = self._next_epoch
            self._open = self._reader.epoch(number)
            self._open_resumed = False
        self._open_epoch, self._next_epoch = number, number + 1
        self._open_done = self._open_failed = False
        self._open_taken = 0
        self._moved_on = None

    def _open_running(self) -> bool:
        """An epoch is open that the loop took batches of and may go on with: not at its end, not failed."""
        return self._open is not None and self._open_taken > 0 and not (self._open_done or self._open_failed)

    def _open_untouched(self) -> bool:
        """An epoch is open that the next iteration takes: opened ahead by ``len()``, or handed out by an
        ``iter()`` that took no batch of it."""
        return self._open is not None and not (self._open_done or self._open_failed) and self._open_taken == 0

    def _run(self, iteration: int) -> Iterator[Any]:
        if self._iterations != iteration or self._closed:
            raise ClosedError(self._ended(None))
        if self._follow_lightning():
            return  # an epoch over before the state was taken: Lightning ends it now, and asks for the next
        if not self._open_untouched():  # set_epoch() or load_state_dict() since iter() closed what it had opened
            self._open_next()
        batches, epoch = self._open, self._open_epoch
        assert batches is not None
        place = self._tensors.place_now if self._tensors is not None else None
        # Asked before each batch: an iteration that took none shares its epoch with the iter() after it.
        while self._open is batches and self._iterations == iteration:
            try:
                batch = next(batches)
            except StopIteration:
                self._open_done = True
                self._settle_same_epoch(epoch)  # set at its last batch: the next epoch is next
                return
            except BaseException:
                # A worker's error at its first batch: the next iter() runs the next epoch, as after one that
                # failed later, not this one's spent iterator (which would end at once, without a word).
                self._open_failed = True
                self._settle_same_epoch(epoch)
                raise
            if self._moved_on == epoch:  # set_epoch of this very epoch, during it: the next one is still next
                self._settle_same_epoch(epoch)
            elif self._moved_on is not None and self._open_resumed:
                # A loaded state's epoch, going on after set_epoch of another: refused as before its first batch.
                number, self._moved_on = self._moved_on, None
                self._open_failed = True
                raise ValueError(_resumed_moved_on(epoch, number))
            elif self._moved_on is not None:
                # Another epoch asked for while this one goes on: Lightning, where len() is unknown, takes the
                # first batch before calling set_epoch (resumed from an epoch-end checkpoint, this epoch is
                # epoch 0 and it asks for the next). Going on would run the wrong epoch whole; this iteration
                # runs the epoch asked for from its start, the batches taken before counted with it.
                log.warning(_switched_epoch(epoch, self._moved_on, self._open_taken))
                self._open_next()
                assert self._open is not None
                batches, epoch = self._open, self._open_epoch
                continue
            self._open_taken += 1
            yield batch if place is None else place(batch)
        raise ClosedError(self._ended(epoch))

    def _settle_same_epoch(self, epoch: int) -> None:
        """A ``set_epoch(epoch)`` made while this epoch was iterated meant this one: the next epoch stays next."""
        if self._moved_on == epoch:
            self._moved_on, self._next_epoch = None, epoch + 1

    def _ended(self, epoch: int | None) -> str:
        # Ended by a later iter(), load_state_dict() or close(), not at its end: zip(data, data) ran no step,
        # and an outer loop stopped after an inner pass, without a word. torch's iterations run side by
        # side; these read one stream of epochs, one at a time (as Client.epoch() and Loader.epoch() say).
        if self._closed:
            ended = "close()"
        else:  # before its first batch, only a later iter(): load_state_dict() moves where it will start
            ended = "a later iter()" if epoch is None else "a later iter() or load_state_dict()"
        which = "this iteration" if epoch is None else f"this iteration of epoch {epoch}"
        return (
            f"{which} was ended by {ended}"
            + (" before its first batch" if epoch is None else " before its end")
            + ": loader.torch.DataLoader runs one iteration at a time (torch's runs several side by side); finish "
            "or leave one before the next"
        )

    def _close_open(self) -> None:
        if self._open is not None:
            close = getattr(self._open, "close", None)
            if close is not None:
                close()
        self._open = None


class EpochSetter:
    """``DataLoader.sampler``: its ``set_epoch`` is the ``DataLoader``'s. There are no indices to sample: the
    daemon's config shuffles and batches."""

    def __init__(self, data: DataLoader) -> None:
        self._data = data

    def set_epoch(self, epoch: int) -> None:
        """``DataLoader.set_epoch(epoch)``."""
        self._data.set_epoch(epoch)

    def __repr__(self) -> str:
        return "<loader.torch.DataLoader.sampler: set_epoch only>"


StatefulDataLoader = DataLoader  # torchdata's name for a DataLoader with state_dict/load_state_dict


def _check_source(source: Any) -> None:
    """Refuse what is neither an address, a config nor a reader (``TypeError``)."""
    if hasattr(source, "epoch") or isinstance(source, (LoaderConfig, str, bytes, os.PathLike)) or source is None:
        return
    # A torch Dataset (or a list of samples), as torch's DataLoader takes: it failed deep in load_config with
    # "expected str, bytes or os.PathLike object", saying nothing of what this class reads.
    raise TypeError(
        f"loader.torch.DataLoader reads a loader daemon's address, a config (a TOML path or LoaderConfig) or a "
        f"loader Client/Loader, not a {type(source).__name__}: the config's [source] names the files, which "
        "the daemon's workers read (README: Your data)"
    )


def _open(source: Source, device: Any, dataset: str, options: dict[str, Any]) -> tuple[Reader, Reader | None]:
    """(where batches come from, what ``close()`` closes): a Client, a Loader, or what was given."""
    if hasattr(source, "epoch"):
        given = {key: value for key, value in options.items() if value is not None}
        if given or device != "torch" or dataset != "default":
            torch_names = [name for name in sorted(given) if name in _TORCH_ARGUMENTS]
            if torch_names:  # no Client takes batch_size either: "give it to the Client" misled
                raise TypeError(f"a Client or Loader is used as it is, and takes no {torch_names}{_hints(torch_names)}")
            raise TypeError(
                f"a Client or Loader is used as it is: give {sorted(given) or 'device/dataset'} to it instead"
            )
        return cast(Reader, source), None
    if isinstance(source, LoaderConfig):
        return _local(source, device, dataset, options)
    if source is not None and _is_config_file(source):
        return _local(load_config(source), device, dataset, options)
    from loader.service.client.client import Client  # the service stack (zmq) only when used

    address = None if source is None else os.fspath(source)  # the Client reads HOST:PORT and config files
    given = {key: value for key, value in options.items() if value is not None}
    known = set(inspect.signature(Client).parameters) - {"address", "device", "dataset", "channel"}
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(
            f"DataLoader over a daemon takes the Client options {sorted(known)}, not {unknown}{_hints(unknown)}"
        )
    client = Client(address, device=_torch_place(device), dataset=dataset, **given)
    return cast(Reader, client), cast(Reader, client)


# Where what torch's DataLoader takes as arguments lives here: the daemon's config decides the data.
_TORCH_ARGUMENTS = {
    "batch_size": "[pipeline] batch_size in the config",
    "shuffle": "[pipeline] shuffle_buffer and seed in the config",
    "sampler": "the config's [pipeline] shuffle_buffer and seed (and rank/world_size here)",
    "batch_sampler": "[pipeline] batch_size, shuffle_buffer and seed in the config",
    "num_workers": "[workers] count in the config",
    "collate_fn": "[pipeline] batch_mappers (or mappers) in the config",
    "drop_last": "[pipeline] drop_last in the config",
    "pin_memory": "device='cuda' (batches are copied from pinned memory ahead of the loop)",
    "prefetch_factor": "prefetch (messages read ahead)",
    "persistent_workers": "nothing: the workers always persist",
    "worker_init_fn": "a mapper's module, imported once in each worker",
    "generator": "[pipeline] seed in the config",
    "timeout": "timeout_s",
}


# torch's DataLoader(dataset, batch_size, shuffle, ...): what each positional argument after the dataset is.
_TORCH_POSITIONAL = (
    "batch_size",
    "shuffle",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "drop_last",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
)


def _positional_error(values: tuple[Any, ...]) -> str:
    """The error line for arguments given after the source, named as torch's DataLoader reads them."""
    names = [_TORCH_POSITIONAL[i] if i < len(_TORCH_POSITIONAL) else f"argument {i + 2}" for i in range(len(values))]
    taken = ", ".join(f"{name}={value!r}" for name, value in zip(names, values))
    return (
        f"loader.torch.DataLoader takes only the source positionally, not torch's {taken}{_hints(names)}; "
        "over an address, the config is the daemon's"
    )


def _hints(unknown: list[str]) -> str:
    """Where torch's DataLoader arguments among ``unknown`` are set here, as the end of an error line."""
    hints = [f"{name}: {_TORCH_ARGUMENTS[name]}" for name in unknown if name in _TORCH_ARGUMENTS]
    return f" ({'; '.join(hints)})" if hints else ""


def _is_config_file(source: str | os.PathLike[str]) -> bool:
    """A path object, a ``.toml`` name or an existing file is a config; other strings are addresses."""
    if not isinstance(source, str):
        return True
    return not source.startswith(("tcp://", "ipc://")) and (source.endswith(".toml") or os.path.isfile(source))


def _local(config: LoaderConfig, device: Any, dataset: str, options: dict[str, Any]) -> tuple[Reader, Reader]:
    """A ``Loader`` of ``config`` (its daemon on a thread of this process), and what to read of it."""
    from loader.service.local import Loader

    options = {key: value for key, value in options.items() if value is not None}
    rank, world_size, job = options.pop("rank", 0), options.pop("world_size", None), options.pop("job", None)
    separate = "a config runs a daemon of its own in each process, which shares no epoch between ranks or jobs"
    if (rank, world_size or 1, job) != (0, 1, None):
        raise ValueError(f"{separate}: run `loader serve CONFIG` and give every rank its address")
    from loader.service.client.env import integer_variable, process_group  # the client package imports zmq

    # torchrun's variable only: SLURM_NTASKS is also set for one plain `python train.py` in an sbatch script.
    ranks, variable = integer_variable(os.environ, ("WORLD_SIZE",), 1)
    group = process_group()
    if variable is None and group is not None:  # mp.spawn's ranks: a process group, and no variable
        ranks, variable = group[1], "torch.distributed's world_size"
    if world_size is None and ranks > 1:  # torchrun, Slurm or mp.spawn started this process as one of several ranks
        raise ValueError(
            f"{variable}={ranks}: this process is one of {ranks} ranks, and {separate}, so each would read "
            "the whole dataset: run `loader serve CONFIG` and give every rank its address (or pass world_size=1 "
            "if each rank is to read all of it)"
        )
    known = {field.name for field in dataclasses.fields(ClientConfig) if field.name != "origin"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"with a config, DataLoader takes the [client] options {sorted(known)}, not {unknown}{_hints(unknown)}"
        )
    place = _torch_place(device)
    place = place if isinstance(place, str) else str(place)  # a torch.device as client.device's text
    # As an override, so that a bad value is blamed on these arguments, not on the config file.
    arguments = ", ".join(f"{key}={value!r}" for key, value in {**options, "device": device}.items())
    changes = {f"client.{key}": value for key, value in {**options, "device": place}.items()}
    local = Loader(config.override(changes, origin=f"DataLoader({arguments})"))
    try:
        reader = local if dataset == "default" else local.client(dataset)  # the Loader closes its clients
    except BaseException:
        local.close()
        raise
    return cast(Reader, reader), cast(Reader, local)


def _torch_place(device: Any) -> Any:
    """``device`` as a ``Client`` place of torch tensors: ``"cpu"`` means CPU tensors here, as in torch, and so
    do None (torch's "the default device") and fluid's ``CPUPlace()``, which a ``Client`` reads as numpy."""
    device = place_name(device)  # None and fluid's places as place strings
    if type(device).__module__.startswith("torch") and getattr(device, "type", None) == "cpu":
        return "torch:cpu"  # torch.device("cpu"): became the text "cpu" for a config, which a Loader gives as numpy
    if isinstance(device, str):
        text = device.strip().lower()
        if text == "cpu":
            return "torch:cpu"
        if text.startswith("cupy"):
            raise ValueError(f"loader.torch gives torch tensors: device {device!r} would give cupy arrays")
    return device


def _parse_state(state: Mapping[str, Any]) -> tuple[int, bool, Mapping[str, Any]]:
    if not isinstance(state, Mapping) or any(key not in state for key in STATE_KEYS):
        raise ValueError(f"not a loader.torch.DataLoader state: expected a dict with keys {list(STATE_KEYS)}")
    epoch, resume, reader = state["epoch"], state["resume"], state["reader"]
    if not isinstance(resume, bool) or not isinstance(reader, Mapping):
        raise ValueError("not a loader.torch.DataLoader state: 'resume' must be a bool and 'reader' a dict")
    number = _epoch_number(epoch)
    from loader.service.client.checkpoint import STATE_KIND  # the service stack only when needed

    inner = reader.get("epoch")
    if resume and reader.get("kind") == STATE_KIND and inner != number:
        # The reader's part is checked (its digest); this number is not, and it said which epoch the iterations
        # after the resumed one run: an edited 2 over a reader in epoch 1 skipped epoch 2 without a word.
        raise ValueError(
            f"a loader.torch.DataLoader state in the middle of epoch {number} whose reader stands in epoch "
            f"{inner!r}: the state was edited or damaged; save it again from state_dict()"
        )
    return number, resume, reader


def _steps_before(state: Any, batch_size: int | None) -> int | None:
    """The steps a loop took of an epoch before ``state`` was taken (its position, in steps of the world size it
    was taken at), or None where the state or the batch size does not say."""
    if not isinstance(state, dict) or not isinstance(batch_size, int) or batch_size < 1:
        return None
    position, world_size = state.get("position"), state.get("world_size")
    if type(position) is not int or type(world_size) is not int or position < 0 or world_size < 1:
        return None
    return -(-position // (world_size * batch_size))


def _epoch_start(reader: Mapping[str, Any], epoch: int) -> dict[str, Any]:
    """The reader part of a between-epochs state, moved to the start of ``epoch`` (the next one), whatever
    position the reader stood at when the state was taken. A ``Client``/``Loader`` state says where in which
    epoch; another reader's state is given as it is."""
    from loader.service.client.checkpoint import STATE_KIND, at_epoch_start  # the service stack only when needed

    state = dict(reader)
    return at_epoch_start(state, epoch) if state.get("kind") == STATE_KIND else state


def _refused_epoch(resuming: int, number: int, left: int | None) -> str:
    """Why ``set_epoch(number)`` is refused after loading a state in epoch ``resuming`` with ``left`` batches
    left (None: not known)."""
    skipped = f"epoch {resuming + 1}" if number == resuming + 2 else f"epochs {resuming + 1}-{number - 1}"
    if left == 0:
        return (
            f"the loaded state was taken at epoch {resuming}'s last batch: set_epoch({resuming + 1}) starts the next "
            f"epoch; set_epoch({number}) would skip {skipped}"
        )
    rest = "the rest of it" if left is None else f"the {left} batch(es) left of it"
    if number > resuming + 1:
        rest += f" and skip {skipped}"
    return (
        f"the loaded state is in the middle of epoch {resuming}: set_epoch({resuming}) continues it, "
        f"set_epoch({resuming + 1}) starts the next; set_epoch({number}) would drop {rest}"
    )


def _resumed_moved_on(epoch: int, number: int) -> str:
    """The error line for a loaded state's epoch whose iteration went on after ``set_epoch(number)``."""
    skipped = "" if number <= epoch + 1 else f" and skip epoch(s) {epoch + 1}-{number - 1}"
    return (
        f"set_epoch({number}) was called while the loaded state's epoch {epoch} was iterated, and the iteration "
        f"went on: that would drop the rest of epoch {epoch}{skipped}. set_epoch({epoch}) continues it (as a loop "
        "that calls set_epoch with the checkpoint's epoch does); to move on, leave the loop first"
    )


def _dropped_rest(resuming: int, number: int, left: int | None) -> str:
    """The warning for ``set_epoch(number)``, the next epoch, after a state in the middle of epoch ``resuming``."""
    rest = "the rest of it" if left is None else f"the {left} batch(es) left of it"
    return (
        f"set_epoch({number}) after loading a state in the middle of epoch {resuming} drops {rest}, as a new "
        f"iteration drops an unfinished epoch (a loop that ends its epochs early, as Lightning's "
        f"limit_train_batches does); set_epoch({resuming}) would have continued it"
    )


def _takes_held(reader: Reader) -> bool:
    try:
        return "held" in inspect.signature(reader.state_dict).parameters
    except (TypeError, ValueError):  # a builtin or an object of another kind: no signature to read
        return False


def _resumed_at_an_epochs_end(epoch: int) -> str:
    return (
        f"a Lightning fit resumed from a checkpoint of epoch {epoch}'s last step goes on with epoch {epoch}, which has "
        "no batch left (len() is unknown, so Lightning could not tell that step was the last); Lightning then makes "
        f"no new iterator for epoch {epoch + 1}, which runs no step, so its samples are not trained: checkpoint at "
        "epoch ends, or at steps that are not an epoch's last"
    )


def _cannot_hold_back(held: int, taken: int) -> str:
    return (
        f"the training loop holds {held} batch(es) it took ahead of its step, but this iteration gave {taken} "
        "that a state could be taken before: the state is taken after them, so a resume from it does not give "
        "them again"
    )


def _switched_epoch(epoch: int, number: int, taken: int) -> str:
    """The warning for an iteration of ``epoch`` that went on after ``set_epoch(number)``."""
    return (
        f"set_epoch({number}) was called after this iteration had given {taken} batch(es) of epoch {epoch}, and it "
        f"went on: it now runs epoch {number} from its first batch, so those batch(es) of epoch {epoch} come "
        f"before it. Lightning does this where len() is unknown (it takes a batch before calling set_epoch): a fit "
        "resumed from a checkpoint between epochs, or a DataLoader used for a second fit, trains one batch of "
        "another epoch first"
    )


def _epoch_number(epoch: Any) -> int:
    """A whole number >= 0: an int, a numpy integer or a one-element integer tensor (DistributedSampler's
    set_epoch takes those); not a bool or a float."""
    if isinstance(epoch, bool) or getattr(getattr(epoch, "dtype", None), "is_floating_point", False):
        number = None
    else:
        try:
            number = operator.index(epoch)
        except TypeError:
            number = None
    if number is None or number < 0:
        raise ValueError(f"an epoch is a whole number >= 0, got {type(epoch).__name__} {epoch!r}")
    return number


__all__ = ["DataLoader", "EpochSetter", "Reader", "StatefulDataLoader"]
