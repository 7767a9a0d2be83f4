"""A module the patch tests change."""


def answer():
    return 41


def greeting():
    return "hello"
