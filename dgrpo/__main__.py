from dgrpo.cli import app

app()
