def validate_api_server_args(args):
    pass
