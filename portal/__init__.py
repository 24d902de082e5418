"""The web portal: server-rendered pages over the services and selectors of the other apps."""
