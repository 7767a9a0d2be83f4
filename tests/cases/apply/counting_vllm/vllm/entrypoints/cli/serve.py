class ServeSubcommand:
    def subparser_init(self, sub):
        serve = sub.add_parser("serve")
        serve.add_argument("model_tag", nargs="?")
        serve.add_argument("--model", default=None)
        serve.add_argument("--tokenizer", default=None)
        serve.add_argument("--hf-config-path", default=None)
        serve.add_argument("--revision", default=None)
        serve.add_argument("--port", type=int, default=8000)
        return serve

    def cmd(self, args):
        pass

    def validate(self, args):
        pass
