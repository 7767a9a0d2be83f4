import argparse


class FlexibleArgumentParser(argparse.ArgumentParser):
    pass
