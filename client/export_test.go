package client

// PublishManyCalls is how many PublishMany calls c's senders had answered,
// for the external tests to tell that attempts were gathered.
func PublishManyCalls(c *Client) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, b := range c.streams {
		n += b.pub.many.Load()
	}
	return n
}
