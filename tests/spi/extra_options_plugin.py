"""A plugin module loaded through DSTL_PLUGINS that declares one general option."""

from dstl.spi import ConfigOption, OptionType, hookimpl


@hookimpl
def dstl_config_options():
    return [ConfigOption("dstl.example.flush-interval", OptionType.DURATION, 5.0, "an example option")]
