import datetime

import pytest

from dstl.spi import Config, ConfigError, ConfigOption, OptionType, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("10ms", 0.01),
        ("1s", 1.0),
        ("2min", 120.0),
        ("1 h", 3600.0),
        ("1.5s", 1.5),
        ("250", 0.25),
        ("1d", 86400.0),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_duration_typed_values():
    assert parse_duration(datetime.timedelta(seconds=3)) == 3.0
    assert parse_duration(500) == 0.5


@pytest.mark.parametrize("bad", ["", "ten ms", "10 lightyears", "-1s", True])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("5mb", 5 * 1024**2),
        ("64kb", 65536),
        ("1gb", 1024**3),
        ("512", 512),
        ("10 MB", 10 * 1024**2),
        ("2MiB", 2 * 1024**2),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["5 parsecs", "-3", "mb", 1.5])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_typo_suggests_closest_key():
    with pytest.raises(ConfigError) as info:
        Config({"dstl.dfs.upload.timout": "1s"})
    message = str(info.value)
    assert "'dstl.dfs.upload.timout'" in message
    assert "did you mean 'dstl.dfs.upload.timeout'" in message


def test_bad_value_names_key_and_form():
    with pytest.raises(ConfigError) as info:
        Config({"dstl.dfs.upload.timeout": "soon"})
    message = str(info.value)
    assert "dstl.dfs.upload.timeout" in message and "duration" in message and "10ms" in message


def test_enum_and_minimum():
    with pytest.raises(ConfigError, match="fixed\\|none"):
        Config({"dstl.dfs.upload.retry-policy": "exponential"})
    with pytest.raises(ConfigError, match="minimum"):
        Config({"dstl.dfs.upload.max-attempts": "0"})


def test_values_parse_and_defaults_apply():
    config = Config(
        {
            "dstl.dfs.batch.persist-delay": "10ms",
            "dstl.dfs.upload.timeout": "2min",
            "dstl.dfs.batch.persist-size-threshold": "5mb",
            "dstl.changelog.compression": "none",
        }
    )
    assert config["dstl.dfs.batch.persist-delay"] == pytest.approx(0.01)
    assert config["dstl.dfs.upload.timeout"] == 120.0
    assert config["dstl.dfs.batch.persist-size-threshold"] == 5 * 1024**2
    assert config["dstl.changelog.compression"] == "none"
    assert config["dstl.dfs.upload.max-attempts"] == 3  # default
    assert config["dstl.storage"] == "local"
    assert "dstl.dfs.upload.max-attempts" not in config


def test_get_of_unknown_key_is_an_error():
    with pytest.raises(ConfigError, match="unknown config key"):
        Config({})["dstl.nope"]


def test_unknown_namespace_hints_at_missing_plugin():
    with pytest.raises(ConfigError, match="is the storage plugin installed"):
        Config({"dstl.cassandra.hosts": "x"})


class FakeSparkConf:
    def __init__(self, pairs):
        self._pairs = pairs

    def getAll(self):
        return list(self._pairs.items())


def test_spark_conf_reads_prefixed_keys_only():
    conf = FakeSparkConf(
        {
            "spark.dstl.storage": "memory",
            "spark.dstl.dfs.upload.timeout": "3s",
            "spark.sql.shuffle.partitions": "2",
            "spark.app.name": "x",
        }
    )
    config = Config.from_spark_conf(conf)
    assert config["dstl.storage"] == "memory"
    assert config["dstl.dfs.upload.timeout"] == 3.0
    assert set(config) == {"dstl.storage", "dstl.dfs.upload.timeout"}


def test_spark_conf_typo_is_reported_without_prefix_confusion():
    with pytest.raises(ConfigError, match="did you mean 'dstl.storage'"):
        Config.from_spark_conf({"spark.dstl.storag": "memory"})


def test_spark_conf_extra_overrides():
    config = Config.from_spark_conf({"spark.dstl.storage": "memory"}, extra={"dstl.storage": "local"})
    assert config["dstl.storage"] == "local"


def test_prefix_options_pass_through():
    options = [
        ConfigOption("dstl.x.producer.*", OptionType.STRING, None, "pass-through"),
        ConfigOption("dstl.x.topic", OptionType.STRING, "t", "topic"),
    ]
    config = Config({"dstl.x.producer.acks": "all", "dstl.x.producer.linger.ms": 5}, options=options)
    assert config.with_prefix("dstl.x.producer.") == {"acks": "all", "linger.ms": "5"}
    with pytest.raises(ConfigError, match="did you mean 'dstl.x.topic'"):
        Config({"dstl.x.topik": "a"}, options=options)


def test_repr_masks_secrets():
    options = [ConfigOption("dstl.x.producer.*", OptionType.STRING, None, "pass-through")]
    config = Config({"dstl.x.producer.sasl.password": "hunter2"}, options=options)
    assert "hunter2" not in repr(config)


def test_with_values_revalidates():
    config = Config({"dstl.storage": "memory"})
    assert config.with_values({"dstl.dfs.upload.timeout": "5s"})["dstl.dfs.upload.timeout"] == 5.0
    with pytest.raises(ConfigError):
        config.with_values({"dstl.dfs.upload.timeout": "x"})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("dstl.dfs.upload.max-in-flight", "0", "below the minimum"),
        ("dstl.dfs.batch.persist-delay", "99999999999999999999", "above the maximum"),
        ("state.changelog.materialization.max-log-ratio", "nan", "not a finite number"),
        ("state.changelog.materialization.max-log-ratio", "inf", "not a finite number"),
        ("dstl.dfs.upload.timeout", datetime.timedelta(seconds=-5), "non-negative"),
        ("dstl.local.dir", " ", "blank"),
        ("state.backend.max-parallelism", str(2**40), "above the maximum 32768"),
        ("state.backend.lmdb.map-size", str(10**30), "above the maximum"),
        ("dstl.local.segment-size", "10000000000000000000000gb", "above the maximum"),
    ],
)
def test_values_out_of_range_are_config_errors_naming_key_and_range(key, value, says):
    with pytest.raises(ConfigError, match=says) as info:
        Config.of({key: value})[key]
    assert key in str(info.value)


def test_flinks_keys_are_aliases_of_the_options_they_name():
    config = Config(
        {
            "state.changelog.storage": "filesystem",
            "state.changelog.dstl.dfs.base-path": "file:///tmp/x",
            "state.changelog.periodic-materialize.interval": "5min",
            "execution.checkpointing.dir": "file:///tmp/chk",
            "execution.checkpointing.num-retained": 3,
        }
    )
    assert config["dstl.storage"] == "filesystem" and "state.changelog.storage" in config
    assert config["dstl.dfs.base-path"] == "file:///tmp/x"
    assert config["state.changelog.materialization.interval"] == 300.0
    assert config["state.checkpoints.dir"] == "file:///tmp/chk"
    assert config.raw()["state.checkpoints.num-retained"] == 3  # held under the option's own name
    assert Config({"dstl.storage": "local", "state.changelog.storage": "local"})["dstl.storage"] == "local"
    with pytest.raises(ConfigError, match="both set 'dstl.storage'"):
        Config({"dstl.storage": "local", "state.changelog.storage": "kafka"})
    with pytest.raises(ConfigError, match="state.changelog.periodic-materialize.interval"):
        Config({"state.changelog.periodic-materialize.interval": "soon"})  # the error names the key given


def test_dstl_config_lists_the_aliases():
    from dstl.spi.cli import config_markdown

    table = config_markdown()
    row = next(line for line in table.splitlines() if line.startswith("| dstl.storage |"))
    assert "state.changelog.storage" in row


def test_a_config_is_a_value_it_discovers_no_plugins(monkeypatch):
    """Given options, a config needs nothing else; without, it asks the installed source (the registry)."""
    import dstl.spi.config as config_module

    def no_discovery():
        raise AssertionError("a config with options discovered plugins")

    declared = [ConfigOption("x.size", OptionType.SIZE, 1, "a size")]
    monkeypatch.setattr(config_module, "_declared", no_discovery)
    assert Config({"x.size": "2kb"}, options=declared)["x.size"] == 2048
    with pytest.raises(AssertionError, match="discovered plugins"):
        Config({})
    monkeypatch.setattr(config_module, "_declared", None)
    with pytest.raises(ConfigError, match="no declared options"):
        Config({})


def test_options_default_into_a_checkpoint_location_as_paths_or_urls(tmp_path):
    from dstl.spi import UnderCheckpoint

    as_path, as_url = UnderCheckpoint("logs"), UnderCheckpoint("objects", as_url=True)
    assert as_path.value(str(tmp_path)) == str(tmp_path / "logs")
    assert as_path.value(tmp_path.as_uri()) == str(tmp_path / "logs")
    assert as_path.value("s3://bucket/query") is None  # a local directory has no place on S3
    assert as_url.value(str(tmp_path)) == (tmp_path / "objects").as_uri()
    assert as_url.value("s3://bucket/query/") == "s3://bucket/query/objects"
    spaced = tmp_path / "a query"
    assert as_path.value(spaced.as_uri()) == str(spaced / "logs")  # %20 decoded
    assert as_path.value(f"file:{spaced}") == str(spaced / "logs")  # Spark's file:/ spelling
    assert as_url.value(f"file:{spaced}") == (spaced / "objects").as_uri()

    options = [
        ConfigOption("x.dir", OptionType.STRING, None, "A directory.", under_checkpoint=as_path),
        ConfigOption("x.url", OptionType.STRING, None, "A URL.", under_checkpoint=as_url),
        ConfigOption("x.other", OptionType.STRING, None, "No default location."),
    ]
    placed = Config({"x.url": "memory://set"}, options=options).under_checkpoint(str(tmp_path))
    assert dict(placed) == {"x.dir": str(tmp_path / "logs"), "x.url": "memory://set"}
    assert (
        "in the query's checkpoint location" in options[0].full_doc
        and options[2].full_doc == "No default location."
    )
    on_s3 = Config({}, options=options).under_checkpoint("s3://bucket/query")
    assert dict(on_s3) == {"x.url": "s3://bucket/query/objects"}
