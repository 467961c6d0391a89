"""The HTTP edge: what stands between the network and the routes (keys, CORS, body limits), and the serve command."""
